//! Band arithmetic and partition names: pure functions, no Postgres calls, so they
//! are tested with plain `#[test]`s.
//!
//! A band is a half-open range `[start, end)` of sequence ids of one originator.
//! `end == None` stands for `MAXVALUE`: the last band before `i64::MAX` cannot be
//! expressed with an exclusive integer bound, so it is unbounded above instead of
//! overflowing.

/// Postgres truncates identifiers longer than `NAMEDATALEN - 1` bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// The two partitioned tables of the store. Every partition exists once per table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    Meta,
    Blob,
}

impl Table {
    pub const ALL: [Table; 2] = [Table::Meta, Table::Blob];

    /// Unqualified name of the partitioned root table.
    pub const fn root_name(self) -> &'static str {
        match self {
            Table::Meta => "gateway_envelopes_meta",
            Table::Blob => "gateway_envelopes_blob",
        }
    }
}

/// Why a band cannot be computed. Both are caller mistakes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BandError {
    #[error("originator_sequence_id must not be negative (got {0})")]
    NegativeSequence(i64),
    #[error("band width must be positive (got {0})")]
    NonPositiveWidth(i64),
}

/// A half-open range of sequence ids; `end == None` means `MAXVALUE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub start: i64,
    pub end: Option<i64>,
}

impl Band {
    /// The band of width `width` that contains `seq`, aligned on multiples of `width`.
    pub fn containing(seq: i64, width: i64) -> Result<Band, BandError> {
        if width <= 0 {
            return Err(BandError::NonPositiveWidth(width));
        }
        if seq < 0 {
            return Err(BandError::NegativeSequence(seq));
        }
        let start = seq - seq % width;
        Ok(Band {
            start,
            end: start.checked_add(width),
        })
    }

    /// Shrinks the band so that it starts no lower than `floor` and ends no higher
    /// than `ceiling`, the bounds of the neighbouring bands that already exist.
    pub fn clamped(self, floor: Option<i64>, ceiling: Option<i64>) -> Band {
        let start = floor.map_or(self.start, |f| self.start.max(f));
        let end = match (self.end, ceiling) {
            (Some(e), Some(c)) => Some(e.min(c)),
            (None, c) => c,
            (e, None) => e,
        };
        Band { start, end }
    }

    /// The upper bound as written in names (`i64::MAX` for `MAXVALUE`).
    pub fn end_label(&self) -> i64 {
        self.end.unwrap_or(i64::MAX)
    }

    /// The `FOR VALUES` clause of this band. Both bounds are integers formatted by
    /// Rust, never caller text.
    pub fn for_values(&self) -> String {
        match self.end {
            Some(end) => format!("FOR VALUES FROM ({}) TO ({end})", self.start),
            None => format!("FOR VALUES FROM ({}) TO (MAXVALUE)", self.start),
        }
    }
}

/// Name of the originator-level partition, e.g. `gateway_envelopes_meta_o7`.
pub fn originator_table_name(table: Table, node: i32) -> String {
    format!("{}_o{node}", table.root_name())
}

/// Name of a band partition, e.g. `gateway_envelopes_meta_o7_s1000000_2000000`.
///
/// The full form can exceed 63 bytes for very large ids; then the end is left out
/// (`..._o7_s9223372036854000000`). The start alone is still unique within one
/// originator because its bands never overlap.
pub fn band_table_name(table: Table, node: i32, band: &Band) -> String {
    let full = format!(
        "{}_s{}_{}",
        originator_table_name(table, node),
        band.start,
        band.end_label()
    );
    if full.len() <= MAX_IDENTIFIER_BYTES {
        full
    } else {
        format!("{}_s{}", originator_table_name(table, node), band.start)
    }
}

/// Bounds of an existing range partition; `None` is `MINVALUE`/`MAXVALUE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeBound {
    pub lower: Option<i64>,
    pub upper: Option<i64>,
}

impl RangeBound {
    pub fn contains(&self, seq: i64) -> bool {
        self.lower.is_none_or(|l| seq >= l) && self.upper.is_none_or(|u| seq < u)
    }
}

/// Parses the bound of an originator-level list partition, `FOR VALUES IN (7)`.
/// Returns `None` unless it is exactly one integer.
pub fn parse_list_bound(text: &str) -> Option<i32> {
    let inner = text
        .trim()
        .strip_prefix("FOR VALUES IN (")?
        .strip_suffix(')')?;
    inner.trim().parse::<i32>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_is_aligned_on_width() {
        assert_eq!(
            Band::containing(0, 1_000_000),
            Ok(Band {
                start: 0,
                end: Some(1_000_000)
            })
        );
        assert_eq!(
            Band::containing(999_999, 1_000_000),
            Ok(Band {
                start: 0,
                end: Some(1_000_000)
            })
        );
        assert_eq!(
            Band::containing(1_000_000, 1_000_000),
            Ok(Band {
                start: 1_000_000,
                end: Some(2_000_000)
            })
        );
        assert_eq!(
            Band::containing(7, 1),
            Ok(Band {
                start: 7,
                end: Some(8)
            })
        );
    }

    #[test]
    fn last_band_does_not_overflow() {
        let band = Band::containing(i64::MAX, 1_000_000).unwrap();
        assert_eq!(band.start, i64::MAX - i64::MAX % 1_000_000);
        assert_eq!(band.end, None);
        assert_eq!(
            band.for_values(),
            format!("FOR VALUES FROM ({}) TO (MAXVALUE)", band.start)
        );
        let whole = Band::containing(i64::MAX, i64::MAX).unwrap();
        assert_eq!(
            whole,
            Band {
                start: i64::MAX,
                end: None
            }
        );
        let first = Band::containing(5, i64::MAX).unwrap();
        assert_eq!(
            first,
            Band {
                start: 0,
                end: Some(i64::MAX)
            }
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(
            Band::containing(-1, 10),
            Err(BandError::NegativeSequence(-1))
        );
        assert_eq!(Band::containing(1, 0), Err(BandError::NonPositiveWidth(0)));
        assert_eq!(
            Band::containing(1, -5),
            Err(BandError::NonPositiveWidth(-5))
        );
    }

    #[test]
    fn clamping_respects_neighbours() {
        let band = Band {
            start: 0,
            end: Some(100),
        };
        assert_eq!(
            band.clamped(Some(10), Some(50)),
            Band {
                start: 10,
                end: Some(50)
            }
        );
        assert_eq!(band.clamped(None, None), band);
        let open = Band {
            start: 0,
            end: None,
        };
        assert_eq!(
            open.clamped(None, Some(70)),
            Band {
                start: 0,
                end: Some(70)
            }
        );
    }

    #[test]
    fn names_follow_the_convention() {
        let band = Band {
            start: 1_000_000,
            end: Some(2_000_000),
        };
        assert_eq!(
            originator_table_name(Table::Meta, 7),
            "gateway_envelopes_meta_o7"
        );
        assert_eq!(
            band_table_name(Table::Blob, 7, &band),
            "gateway_envelopes_blob_o7_s1000000_2000000"
        );
    }

    #[test]
    fn long_names_stay_within_identifier_limit() {
        let band = Band::containing(i64::MAX, 1_000_000).unwrap();
        let name = band_table_name(Table::Meta, i32::MAX, &band);
        assert!(name.len() <= MAX_IDENTIFIER_BYTES, "{name}");
        assert_eq!(
            name,
            format!("gateway_envelopes_meta_o{}_s{}", i32::MAX, band.start)
        );
    }

    #[test]
    fn parses_list_bounds() {
        assert_eq!(parse_list_bound("FOR VALUES IN (5)"), Some(5));
        assert_eq!(parse_list_bound("FOR VALUES IN (5, 6)"), None);
        assert_eq!(parse_list_bound("DEFAULT"), None);
    }
}
