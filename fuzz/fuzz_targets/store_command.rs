//! The bincode decoding of store commands (the form they have in the region group's
//! Raft log and on the wire, move pages included as `Import` entries) on arbitrary bytes: no panic,
//! no unbounded allocation, and a command that decodes encodes to a command
//! that decodes to itself.
#![no_main]

use keyhold_store::Command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(command) = Command::decode(data) else {
        return;
    };
    let again = Command::decode(&command.encode()).expect("an encoded command decodes");
    assert_eq!(again, command);
});
