//! Any lines as an MCP session's input: the screen never panics, and whatever it passes
//! on in a line's place is one line of JSON that passes the screen itself.
#![no_main]

use ailab_sandbox_mcp::{MAX_MESSAGE_BYTES, fuzz_screen};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the line limit (a small one reaches the oversized calls) and
    // whether the session has opened; the rest is the session's input.
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let max_line = if pick & 1 == 0 { MAX_MESSAGE_BYTES } else { 64 + usize::from(pick) };
    let mut started = pick & 2 != 0;
    for line in input.split(|b| *b == b'\n') {
        fuzz_screen(line, max_line, &mut started);
    }
});
