//! Parsers for command-line values every subcommand shares: byte sizes and page sizes.

use vfpoll_dma::PageSize;

/// `4k`, `16m`, `2MiB`, `0`, `512`: binary units.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (like 4096, 4k, 128k, 16m, 8g)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        u => return Err(format!("unknown size unit {u:?} in {s:?} (k, m, g, t)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// Like [`parse_bytes`], refusing 0.
pub fn parse_nonzero_bytes(s: &str) -> Result<u64, String> {
    Some(parse_bytes(s)?)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size {s:?} is zero"))
}

/// `2M` (hugepages), `1G`, or `4K` (no hugepages; only behind an IOMMU).
pub fn parse_page_size(s: &str) -> Result<PageSize, String> {
    match s.to_ascii_uppercase().as_str() {
        "2M" | "2MB" | "2MIB" => Ok(PageSize::Huge2M),
        "1G" | "1GB" | "1GIB" => Ok(PageSize::Huge1G),
        "4K" | "4KB" | "4KIB" => Ok(PageSize::Base4K),
        _ => Err(format!("`{s}` is not a page size: use 2M, 1G or 4K")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_page_sizes() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("16m"), Ok(16 << 20));
        assert_eq!(parse_bytes("2MiB"), Ok(2 << 20));
        assert!(parse_bytes("x").unwrap_err().contains("not a size"));
        assert!(parse_bytes("99999999999t").unwrap_err().contains("too large"));
        assert!(parse_nonzero_bytes("0").unwrap_err().contains("zero"));
        assert_eq!(parse_nonzero_bytes("4k"), Ok(4096));
        assert_eq!(parse_page_size("2m"), Ok(PageSize::Huge2M));
        assert!(parse_page_size("3M").unwrap_err().contains("2M, 1G or 4K"));
    }
}
