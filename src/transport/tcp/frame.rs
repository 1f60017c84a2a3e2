//! The frame header that precedes every payload on a TCP stream (40 bytes, little endian).
#![forbid(unsafe_code)]

use super::config::MAX_FRAME_BYTES;

/// The first two bytes of every frame header.
pub(super) const FRAME_MAGIC: u16 = 0x5754;
pub(super) const OP_WRITE: u8 = 1;
/// Last frame of a stream, sent by `shutdown`: the sender is going away.
pub(super) const OP_CLOSE: u8 = 2;
pub(super) const FLAG_IMM: u8 = 1;
/// On [`OP_CLOSE`]: work requests were still outstanding (dropped), the close is not orderly.
pub(super) const FLAG_DIRTY: u8 = 2;
/// Bytes of a frame header.
pub(super) const HDR_LEN: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) op: u8,
    pub(super) flags: u8,
    pub(super) len: u32,
    pub(super) seq: u64,
    pub(super) addr: u64,
    pub(super) rkey: u32,
    pub(super) imm: u32,
    pub(super) wr_len: u32,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HDR_LEN] {
        let mut h = [0u8; HDR_LEN];
        h[0..2].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        h[2] = self.op;
        h[3] = self.flags;
        h[4..8].copy_from_slice(&self.len.to_le_bytes());
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.addr.to_le_bytes());
        h[24..28].copy_from_slice(&self.rkey.to_le_bytes());
        h[28..32].copy_from_slice(&self.imm.to_le_bytes());
        h[32..36].copy_from_slice(&self.wr_len.to_le_bytes());
        h
    }

    pub(super) fn decode(h: &[u8; HDR_LEN]) -> std::result::Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u16::from_le_bytes([h[0], h[1]]);
        if magic != FRAME_MAGIC {
            return Err(format!(
                "frame magic {magic:#06x}, expected {FRAME_MAGIC:#06x}"
            ));
        }
        let allowed = match h[2] {
            OP_WRITE => FLAG_IMM,
            OP_CLOSE => FLAG_DIRTY,
            op => {
                return Err(format!(
                    "frame operation {op}, accepted: {OP_WRITE} (write) or {OP_CLOSE} (close)"
                ));
            }
        };
        if h[3] & !allowed != 0 {
            return Err(format!(
                "frame flags {:#04x} for operation {}, accepted: 0 or {allowed}",
                h[3], h[2]
            ));
        }
        let hd = Header {
            op: h[2],
            flags: h[3],
            len: u32_at(4),
            seq: u64_at(8),
            addr: u64_at(16),
            rkey: u32_at(24),
            imm: u32_at(28),
            wr_len: u32_at(32),
        };
        if hd.op == OP_CLOSE && hd.len != 0 {
            return Err(format!("close frame with {} payload bytes", hd.len));
        }
        if hd.len as usize > MAX_FRAME_BYTES {
            return Err(format!(
                "frame of {} bytes; at most {MAX_FRAME_BYTES} bytes accepted",
                hd.len
            ));
        }
        Ok(hd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_rejected() {
        let h = Header {
            op: OP_WRITE,
            flags: FLAG_IMM,
            len: 1234,
            seq: 99,
            addr: 0xdead_beef_0000,
            rkey: 7,
            imm: 0x1234_5678,
            wr_len: 4321,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = h.encode();
        bad[2] = 9;
        assert!(Header::decode(&bad).unwrap_err().contains("operation"));
        let mut bad = h.encode();
        bad[3] = 6;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let close = Header {
            op: OP_CLOSE,
            flags: FLAG_DIRTY,
            len: 0,
            seq: 0,
            addr: 0,
            rkey: 0,
            imm: 0,
            wr_len: 0,
        };
        assert_eq!(Header::decode(&close.encode()).unwrap(), close);
        let mut bad = close.encode();
        bad[3] = FLAG_IMM;
        assert!(Header::decode(&bad).unwrap_err().contains("flags"));
        let mut bad = close.encode();
        bad[4] = 1;
        assert!(Header::decode(&bad).unwrap_err().contains("close frame"));
        let mut bad = h.encode();
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Header::decode(&bad).unwrap_err().contains("at most"));
    }
}
