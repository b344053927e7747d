//! riptide-firehose (under construction).
