//! Prints the shape of a corpus: nodes, blocks and bytes per frame (for profiling the decoder).
use riptide_firehose::corpus::split_frames;
use riptide_firehose::FrameDecoder;

fn main() {
    let path = std::env::args().nth(1).expect("usage: shape FILE");
    let file = std::fs::read(path).expect("read");
    let frames = split_frames(&file).expect("corpus");
    let mut dec = FrameDecoder::new();
    let (mut nodes, mut blocks, mut block_bytes, mut strings) = (0usize, 0usize, 0usize, 0usize);
    for f in &frames {
        let frame = dec.decode(f.bytes).expect("frame");
        nodes += frame.payload().node_count() + frame.header().node_count();
        for i in 0..frame.block_count() {
            let v = frame.block_value(i).expect("block");
            nodes += v.node_count();
            strings += count_strings(v);
        }
        if let Some(car) = frame.car() {
            blocks += car.len();
            block_bytes += car.blocks().map(|b| b.data.len()).sum::<usize>();
        }
    }
    let n = frames.len() as f64;
    println!("frames {} nodes/frame {:.0} blocks/frame {:.1} block bytes/frame {:.0} strings/frame {:.0} bytes/frame {:.0}",
        frames.len(), nodes as f64 / n, blocks as f64 / n, block_bytes as f64 / n, strings as f64 / n, file.len() as f64 / n);
}

fn count_strings(v: riptide_cbor::Value<'_>) -> usize {
    use riptide_cbor::Kind;
    match v.kind() {
        Kind::Text | Kind::Bytes | Kind::Link => 1,
        Kind::Array => v.array().into_iter().flatten().map(count_strings).sum(),
        Kind::Map => v
            .map()
            .into_iter()
            .flatten()
            .map(|(k, v)| count_strings(k) + count_strings(v))
            .sum(),
        _ => 0,
    }
}
