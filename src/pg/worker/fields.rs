//! A job's payload as typed fields, written and read back in one order.

/// A job's fields encoded into its payload, in order (little-endian), and read
/// back in the same order with [`Fields::reader`].
#[derive(Default)]
pub struct Fields(Vec<u8>);

impl Fields {
    pub fn with_capacity(bytes: usize) -> Fields {
        Fields(Vec::with_capacity(bytes))
    }

    pub fn i64(&mut self, value: i64) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn i32(&mut self, value: i32) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u32(&mut self, value: u32) -> &mut Fields {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bool(&mut self, value: bool) -> &mut Fields {
        self.0.push(u8::from(value));
        self
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Reads fields from `bytes` in the order they were written.
    pub fn reader(bytes: &[u8]) -> FieldReader<'_> {
        FieldReader(bytes)
    }
}

/// Reads back what [`Fields`] wrote; `None` once the bytes run out.
pub struct FieldReader<'a>(&'a [u8]);

impl FieldReader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }

    pub fn i32(&mut self) -> Option<i32> {
        self.take().map(i32::from_le_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub fn bool(&mut self) -> Option<bool> {
        self.take::<1>().map(|[b]| b != 0)
    }
}
