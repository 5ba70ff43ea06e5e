//! Aligned text tables for human output.

/// Renders `rows` under `header`, each column as wide as its widest cell, two spaces apart,
/// without trailing blanks.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < width.len() {
                width[i] = width[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            s.push_str(c);
            if i + 1 < cells.len() {
                s.extend(std::iter::repeat_n(
                    ' ',
                    width[i].saturating_sub(c.chars().count()),
                ));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn aligns_columns() {
        let t = super::render(
            &["A", "BB", "C"],
            &[
                vec!["xxx".into(), "y".into(), "z".into()],
                vec!["".into(), "".into(), "".into()],
            ],
        );
        assert_eq!(t, "A    BB  C\nxxx  y   z\n\n");
    }
}
