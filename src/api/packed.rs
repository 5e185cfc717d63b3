//! The packed form in which `pg_envelopes_router` sends rows to a shard (see
//! `insert_gateway_envelopes_packed` in [`super::insert`]): base64 of each row's
//! fields, decoded into a [`Batch`].

use crate::store::write::{Batch, InsertError};
use pgrx::datum::TimestampWithTimeZone;

/// An optional column, present when any row has a value.
pub fn present<T>(column: Vec<Option<T>>) -> Option<Vec<Option<T>>> {
    column.iter().any(Option::is_some).then_some(column)
}

/// The first element of an optional column.
pub fn first<T: Copy>(column: &Option<Vec<Option<T>>>) -> Option<T> {
    column.as_ref().and_then(|c| c[0])
}

/// Decodes base64, skipping white space. `encode(..., 'base64')` breaks its
/// lines every 76 characters: those lines are gathered by their fixed stride (a
/// copy per line) and decoded in one pass. Text laid out any other way is decoded
/// as it is, and only if that fails, again without its white space (a test per
/// character, slower).
pub fn decode_base64(text: &str) -> Result<Vec<u8>, InsertError> {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    const LINE: usize = 76;
    let bytes = text.as_bytes();
    let mut compact = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while rest.len() > LINE && rest[LINE] == b'\n' {
        compact.extend_from_slice(&rest[..LINE]);
        rest = &rest[LINE + 1..];
    }
    compact.extend_from_slice(rest.strip_suffix(b"\n").unwrap_or(rest));
    STANDARD.decode(&compact).or_else(|_| {
        let clean: Vec<u8> = bytes
            .iter()
            .copied()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        STANDARD
            .decode(clean)
            .map_err(|e| InsertError::Base64(e.to_string()))
    })
}

/// The rows of `packed_rows` (see [`insert_gateway_envelopes_packed`]) as a
/// batch of `node`; an optional column is present when any row has a value.
pub fn unpack(node: i32, packed: &[u8]) -> Result<Batch<'_>, InsertError> {
    let mut reader = Unpacker { packed, at: 0 };
    let mut batch = Batch {
        nodes: Vec::new(),
        seqs: Vec::new(),
        topics: Vec::new(),
        envelopes: Vec::new(),
        payers: None,
        times: None,
        expiries: None,
    };
    let (mut payers, mut times, mut expiries) = (Vec::new(), Vec::new(), Vec::new());
    while reader.at < packed.len() {
        batch.nodes.push(Some(node));
        batch
            .seqs
            .push(Some(i64::from_be_bytes(reader.fixed("a sequence id")?)));
        batch.topics.push(Some(reader.counted("a topic")?));
        batch.envelopes.push(Some(reader.counted("an envelope")?));
        let at = reader.at;
        let [flags] = reader.fixed::<1>("a flags byte")?;
        if flags & !7 != 0 {
            return Err(InsertError::Packed {
                at,
                what: "a flags byte of 0 to 7",
            });
        }
        payers.push(match flags & 1 {
            0 => None,
            _ => Some(i32::from_be_bytes(reader.fixed("a payer id")?)),
        });
        times.push(match flags & 2 {
            0 => None,
            _ => {
                let at = reader.at;
                let micros = i64::from_be_bytes(reader.fixed("a gateway time")?);
                let time =
                    TimestampWithTimeZone::try_from(micros).map_err(|_| InsertError::Packed {
                        at,
                        what: "a gateway time in range",
                    })?;
                Some(time)
            }
        });
        expiries.push(match flags & 4 {
            0 => None,
            _ => Some(i64::from_be_bytes(reader.fixed("an expiry")?)),
        });
    }
    batch.payers = present(payers);
    batch.times = present(times);
    batch.expiries = present(expiries);
    Ok(batch)
}

/// Reads `packed_rows` from the front.
struct Unpacker<'a> {
    packed: &'a [u8],
    at: usize,
}

impl<'a> Unpacker<'a> {
    /// The next `n` bytes, or where the form ended too soon.
    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], InsertError> {
        let start = self.at;
        let end = start
            .checked_add(n)
            .filter(|&end| end <= self.packed.len())
            .ok_or(InsertError::Packed { at: start, what })?;
        self.at = end;
        Ok(&self.packed[start..end])
    }

    fn fixed<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], InsertError> {
        let at = self.at;
        let bytes = self.bytes(N, what)?;
        bytes
            .try_into()
            .map_err(|_| InsertError::Packed { at, what })
    }

    /// A 4-byte big-endian length, then that many bytes.
    fn counted(&mut self, what: &'static str) -> Result<&'a [u8], InsertError> {
        let at = self.at;
        let len = i32::from_be_bytes(self.fixed(what)?);
        let len = usize::try_from(len).map_err(|_| InsertError::Packed { at, what })?;
        self.bytes(len, what)
    }
}

#[cfg(test)]
mod packed_tests {
    use super::{decode_base64, unpack, InsertError};
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;

    /// `encode(bytes, 'base64')`: line breaks after every 76 characters.
    fn postgres_base64(bytes: &[u8]) -> String {
        let flat = STANDARD.encode(bytes);
        let lines: Vec<&str> = flat
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        lines.join("\n")
    }

    #[test]
    fn base64_decodes_with_and_without_line_breaks() {
        for len in [0usize, 1, 2, 3, 56, 57, 58, 114, 1000, 70_001] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            assert_eq!(
                decode_base64(&postgres_base64(&bytes)).unwrap(),
                bytes,
                "{len}"
            );
            assert_eq!(
                decode_base64(&STANDARD.encode(&bytes)).unwrap(),
                bytes,
                "{len}"
            );
            // Line breaks elsewhere, CRLF and spaces: the slow path, same bytes.
            let odd: String = STANDARD
                .encode(&bytes)
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let sep = if i % 5 == 4 {
                        Some(if i % 2 == 0 { '\n' } else { ' ' })
                    } else {
                        None
                    };
                    std::iter::once(c).chain(sep)
                })
                .collect();
            assert_eq!(decode_base64(&odd).unwrap(), bytes, "{len}");
            assert_eq!(
                decode_base64(&postgres_base64(&bytes).replace('\n', "\r\n")).unwrap(),
                bytes
            );
        }
        for bad in ["QUJD=RA==", "QUJ", "QU!D", "QUJD\nRA=\n=AAA"] {
            assert!(
                matches!(decode_base64(bad), Err(InsertError::Base64(_))),
                "{bad}"
            );
        }
    }

    /// A packed row: sequence id, topic, envelope, then the optional payer,
    /// gateway time (raw microseconds) and expiry.
    type Row<'a> = (
        i64,
        &'a [u8],
        &'a [u8],
        Option<i32>,
        Option<i64>,
        Option<i64>,
    );

    fn packed(rows: &[Row<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(seq, topic, envelope, payer, time, expiry) in rows {
            out.extend(seq.to_be_bytes());
            out.extend((topic.len() as i32).to_be_bytes());
            out.extend(topic);
            out.extend((envelope.len() as i32).to_be_bytes());
            out.extend(envelope);
            let flags = u8::from(payer.is_some())
                | u8::from(time.is_some()) << 1
                | u8::from(expiry.is_some()) << 2;
            out.push(flags);
            out.extend(payer.map(i32::to_be_bytes).into_iter().flatten());
            out.extend(time.map(i64::to_be_bytes).into_iter().flatten());
            out.extend(expiry.map(i64::to_be_bytes).into_iter().flatten());
        }
        out
    }

    #[test]
    fn packed_rows_unpack_to_their_columns_or_say_where_they_end() {
        let rows: [Row<'_>; 3] = [
            (i64::MAX, b"t", b"", None, None, None),
            (-1, b"", b"\0\0", Some(-5), None, Some(i64::MIN)),
            (7, b"topic", b"envelope", None, Some(0), None),
        ];
        let bytes = packed(&rows);
        let batch = unpack(3, &bytes).unwrap();
        assert_eq!(batch.nodes, vec![Some(3); 3]);
        assert_eq!(batch.seqs, vec![Some(i64::MAX), Some(-1), Some(7)]);
        assert_eq!(
            batch.topics,
            vec![Some(&b"t"[..]), Some(&b""[..]), Some(&b"topic"[..])]
        );
        assert_eq!(
            batch.envelopes,
            vec![Some(&b""[..]), Some(&b"\0\0"[..]), Some(&b"envelope"[..])]
        );
        assert_eq!(batch.payers, Some(vec![None, Some(-5), None]));
        assert_eq!(batch.expiries, Some(vec![None, Some(i64::MIN), None]));
        let times = batch.times.as_ref().unwrap();
        assert!(times[0].is_none() && times[1].is_none() && times[2].is_some());
        // No optional value anywhere: the columns are absent.
        let first = packed(&rows[..1]);
        let plain = unpack(3, &first).unwrap();
        assert!(plain.payers.is_none() && plain.times.is_none() && plain.expiries.is_none());
        assert!(unpack(3, &[]).unwrap().nodes.is_empty());
        // Cut anywhere inside: an error naming the byte, never a panic.
        for cut in 1..bytes.len() {
            if cut == packed(&rows[..1]).len() || cut == packed(&rows[..2]).len() {
                continue; // whole rows
            }
            assert!(
                matches!(unpack(3, &bytes[..cut]), Err(InsertError::Packed { .. })),
                "{cut}"
            );
        }
        // Negative and too large lengths.
        for len in [-1i32, i32::MIN, i32::MAX] {
            let mut bad = packed(&rows[..1]);
            bad[8..12].copy_from_slice(&len.to_be_bytes());
            assert!(
                matches!(unpack(3, &bad), Err(InsertError::Packed { at: 8 | 12, .. })),
                "{len}"
            );
        }
        // Unknown flags, and a gateway time outside Postgres' range.
        let mut bad = packed(&rows[..1]);
        let flags = bad.len() - 1;
        bad[flags] = 8;
        assert!(matches!(unpack(3, &bad), Err(InsertError::Packed { .. })));
        let bad = packed(&[(1, b"t", b"e", None, Some(i64::MAX - 1), None)]);
        assert!(matches!(unpack(3, &bad), Err(InsertError::Packed { .. })));
    }
}
