//! Prints the statistics of a corpus file (`riptide_gen::stats::measure`) as JSON.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: measure FILE")?;
    let file = std::fs::read(path)?;
    let frames = riptide_firehose::corpus::split_frames(&file)?;
    let s = riptide_gen::stats::measure(frames.iter().map(|f| f.bytes));
    println!("{}", serde_json::to_string_pretty(&s)?);
    println!(
        "ops/commit {:.3} blocks/commit {:.2} bytes/commit {:.0} bytes/record {:.0}",
        s.ops_per_commit(),
        s.blocks_per_commit(),
        s.bytes_per_commit(),
        s.bytes_per_record()
    );
    Ok(())
}
