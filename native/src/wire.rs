//! The protobuf wire format, read in place: the reader that `scan.rs` and `predict_req.rs` walk messages with.
//! Every method returns `None` for malformed data (a truncated value, a varint over 64 bits, a field number out of
//! protobuf's range, a group or an unknown wire type) and never reads past the buffer.

pub const VARINT: u8 = 0;
pub const I64: u8 = 1;
pub const LEN: u8 = 2;
pub const I32: u8 = 5;

pub struct Reader<'a> {
    buf: &'a [u8],
    /// Offset of the next unread byte in the buffer.
    pub at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    pub fn done(&self) -> bool {
        self.at >= self.buf.len()
    }

    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *self.buf.get(self.at)?;
            self.at += 1;
            if shift == 63 && b > 1 {
                return None; // more than 64 bits
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// (field number, wire type) of the next field.
    pub fn tag(&mut self) -> Option<(u64, u8)> {
        let t = self.varint()?;
        let number = t >> 3;
        if number == 0 || number > (1 << 29) - 1 {
            return None;
        }
        Some((number, (t & 7) as u8))
    }

    /// A length-delimited value: (its offset in the buffer, its bytes).
    pub fn bytes_at(&mut self) -> Option<(usize, &'a [u8])> {
        let n = usize::try_from(self.varint()?).ok()?;
        let start = self.at;
        let end = start.checked_add(n)?;
        let out = self.buf.get(start..end)?;
        self.at = end;
        Some((start, out))
    }

    /// A length-delimited value's bytes.
    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        self.bytes_at().map(|(_, out)| out)
    }

    /// Skips one value of a non-group wire type (varint, fixed64, fixed32, length-delimited).
    pub fn skip(&mut self, wire: u8) -> Option<()> {
        match wire {
            VARINT => {
                self.varint()?;
            }
            I64 => self.advance(8)?,
            I32 => self.advance(4)?,
            LEN => {
                self.bytes()?;
            }
            _ => return None,
        }
        Some(())
    }

    /// Skips `n` bytes.
    pub fn advance(&mut self, n: usize) -> Option<()> {
        let end = self.at.checked_add(n)?;
        if end > self.buf.len() {
            return None;
        }
        self.at = end;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_refuses_malformed_data() {
        // field 1 varint 150, field 2 bytes "ab", field 3 fixed32
        let msg = [0x08, 0x96, 0x01, 0x12, 0x02, b'a', b'b', 0x1d, 1, 2, 3, 4];
        let mut r = Reader::new(&msg);
        assert_eq!(r.tag(), Some((1, VARINT)));
        assert_eq!(r.varint(), Some(150));
        assert_eq!(r.tag(), Some((2, LEN)));
        assert_eq!(r.bytes_at(), Some((5, &b"ab"[..])));
        assert_eq!(r.tag(), Some((3, I32)));
        assert_eq!(r.skip(I32), Some(()));
        assert!(r.done());
        let mut t = Reader::new(&[0x12, 0x05, b'a']);
        assert_eq!(t.tag(), Some((2, LEN)));
        assert_eq!(t.bytes(), None); // truncated
        assert_eq!(Reader::new(&[0xff; 11]).varint(), None); // over 64 bits
        assert_eq!(Reader::new(&[0x00]).tag(), None); // field number 0
        assert_eq!(
            Reader::new(&[0x0b])
                .tag()
                .and_then(|(_, w)| Reader::new(&[]).skip(w)),
            None
        ); // a group
    }
}
