//! How answers print: a volume as JSON or rows, topologies, byte counts,
//! aligned rows and columns.

use super::*;

/// A volume as the documented JSON object.
pub fn volume_json(v: &csi::Volume) -> Value {
    json!({
        "volume_id": v.volume_id,
        "capacity_bytes": v.capacity_bytes,
        "volume_context": segments_json(&v.volume_context),
        "accessible_topology": v.accessible_topology.iter().map(|t| segments_json(&t.segments)).collect::<Vec<_>>(),
    })
}

pub(super) fn volume_rows(v: &csi::Volume) -> Vec<(&'static str, String)> {
    let mut lines = vec![
        ("volume_id", v.volume_id.clone()),
        ("capacity", bytes_h(v.capacity_bytes)),
    ];
    if !v.accessible_topology.is_empty() {
        lines.push(("topology", topologies_h(&v.accessible_topology)));
    }
    if !v.volume_context.is_empty() {
        lines.push(("context", segments_h(&v.volume_context)));
    }
    lines
}

/// A string map as a JSON object with sorted keys.
pub(super) fn segments_json(m: &HashMap<String, String>) -> Value {
    json!(m.iter().collect::<BTreeMap<_, _>>())
}

pub(super) fn segments_h(m: &HashMap<String, String>) -> String {
    let sorted: BTreeMap<_, _> = m.iter().collect();
    sorted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(super) fn topologies_h(t: &[csi::Topology]) -> String {
    if t.is_empty() {
        return "-".to_owned();
    }
    t.iter()
        .map(|t| segments_h(&t.segments))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn list_h(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(", ")
    }
}

/// A CSI byte count for humans (`10Mi`); negative counts are shown as they are.
pub fn bytes_h(n: i64) -> String {
    u64::try_from(n).map_or_else(|_| n.to_string(), human)
}

/// `label  value` lines with the values aligned.
pub fn rows(lines: &[(&str, String)]) -> String {
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(l, v)| format!("{l:<width$}  {v}\n"))
        .collect()
}

/// A table with left-aligned columns separated by two spaces.
pub fn columns(table: &[Vec<String>]) -> String {
    let ncols = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|i| {
            table
                .iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let last = row.len().saturating_sub(1);
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = widths[i] - cell.chars().count() + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}
