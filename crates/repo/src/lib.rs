//! riptide-repo (under construction).
