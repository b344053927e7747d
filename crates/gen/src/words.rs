//! Word lists for handles, hosts and post text: enough variety that generated text compresses
//! and sizes like real text, with no real people's content.

use rand::Rng;

/// Picks one item uniformly.
pub fn pick<'a, R: Rng>(rng: &mut R, items: &[&'a str]) -> &'a str {
    items[rng.gen_range(0..items.len())]
}

/// Handle name parts.
pub const HANDLE_WORDS: &[&str] = &[
    "moss", "fern", "river", "stone", "cloud", "otter", "finch", "maple", "cedar", "ember",
    "pixel", "nova", "lumen", "quill", "harbor", "meadow", "comet", "willow", "aspen", "echo",
    "delta", "sable", "juniper", "pine", "tide", "orbit", "sparrow", "clover", "ivy", "birch",
    "wren", "lark", "fox", "heron", "onyx", "coral", "dune", "frost", "glade", "haze", "iris",
    "jade", "kite", "lotus", "marble", "north", "opal", "prism", "quartz", "rain", "sol", "terra",
    "umber", "vale", "wild", "zephyr", "amber", "bramble", "cobalt", "drift",
];

/// Bluesky PDS host names (the real ones are named after mushrooms).
pub const MUSHROOMS: &[&str] = &[
    "amanita",
    "blewit",
    "chanterelle",
    "elfcup",
    "enoki",
    "morel",
    "oyster",
    "porcini",
    "puffball",
    "shiitake",
    "maitake",
    "lionsmane",
    "inkcap",
    "russula",
    "truffle",
    "woodear",
    "cordyceps",
    "agaric",
    "bolete",
    "hedgehog",
    "matsutake",
    "milkcap",
    "pholiota",
    "scarlet",
];

/// Top-level domains of custom handles.
pub const TLDS: &[&str] = &[
    "com", "net", "org", "dev", "xyz", "io", "social", "blue", "art", "me",
];

/// Post text vocabulary.
pub const TEXT_WORDS: &[&str] = &[
    "the", "a", "and", "to", "of", "in", "is", "it", "that", "for", "on", "with", "this", "my",
    "you", "just", "so", "but", "be", "are", "was", "have", "not", "at", "like", "what", "all",
    "about", "today", "really", "new", "good", "people", "time", "think", "know", "love", "day",
    "one", "out", "up", "more", "when", "can", "get", "how", "there", "we", "they", "morning",
    "coffee", "reading", "thread", "photo", "art", "music", "game", "weekend", "finally", "still",
    "again", "never", "always", "thanks", "everyone", "here", "going", "back", "first", "last",
    "world", "city", "weather", "book", "movie", "walk", "garden", "cat", "dog", "news", "work",
    "project", "release", "code", "bug", "fixed", "shipped", "design", "draw", "paint", "sky",
    "night", "light", "small", "big", "little", "happy", "tired", "lovely", "great", "honestly",
];

/// Hashtags.
pub const TAGS: &[&str] = &[
    "art",
    "photography",
    "bookclub",
    "gamedev",
    "rustlang",
    "music",
    "caturday",
    "birds",
    "science",
    "news",
    "writing",
    "garden",
];

/// Link hosts for external embeds and link facets.
pub const LINK_HOSTS: &[&str] = &[
    "example.com",
    "news.example.org",
    "blog.example.net",
    "video.example.com",
    "shop.example.io",
    "music.example.fm",
    "docs.example.dev",
];

/// Post languages and their weights (per mille), roughly the network's mix.
pub const LANGS: &[(&str, u32)] = &[
    ("en", 620),
    ("ja", 110),
    ("pt", 90),
    ("de", 40),
    ("es", 40),
    ("fr", 30),
    ("ko", 20),
    ("nl", 10),
    ("it", 10),
    ("tr", 10),
    ("pl", 10),
];
