//! riptide-jetstream (under construction).
