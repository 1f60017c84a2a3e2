//! Discovery never panics on odd kernel files: random contents (bytes, numbers, empty, huge) written
//! into any file discovery reads of a fixture, then discovery, grouping, links and the doctor report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use switchless::host::{self, Reader, reader};
use switchless::tools::doctor;

/// A private copy of each fixture (captured once) and the files discovery reads in it (resolved).
struct Copy {
    _dir: tempfile::TempDir,
    root: PathBuf,
    files: Vec<PathBuf>,
}

fn copies() -> &'static [Copy] {
    static C: OnceLock<Vec<Copy>> = OnceLock::new();
    C.get_or_init(|| {
        ["gb10-2cable", "b300-4node"]
            .iter()
            .map(|name| {
                let src = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/fabric")
                    .join(name);
                let rd = Reader::recording(&src);
                let _ = host::discover_with(&rd);
                let dir = tempfile::tempdir().unwrap();
                reader::capture(&rd, dir.path()).unwrap();
                let copy = Reader::new(dir.path());
                let files = rd
                    .recorded()
                    .unwrap()
                    .into_iter()
                    .filter(|(_, a)| *a == reader::Access::File)
                    .filter_map(|(p, _)| copy.resolve(&p).ok())
                    .map(|p| dir.path().join(p.trim_start_matches('/')))
                    .filter(|p| p.is_file())
                    .collect();
                Copy {
                    root: dir.path().to_path_buf(),
                    _dir: dir,
                    files,
                }
            })
            .collect()
    })
}

fn odd_content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "[0-9a-fA-Fx:. /-]{0,48}".prop_map(|s| s.into_bytes()),
        Just(b"".to_vec()),
        Just(b"-1\n".to_vec()),
        Just(b"4294967296\n".to_vec()),
        Just(b"0: \n".to_vec()),
        Just(b"999 Gb/sec\n".to_vec()),
        Just(b"0000:0000:0000:0000:0000:ffff:0000:0000\n".to_vec()),
        Just(b"Iface\nx 00000000 00000000 0001 0 0 0 00000000\n".to_vec()),
        Just(b"Max locked memory unlimited\n".to_vec()),
        Just(vec![b'9'; 5000]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn odd_files_never_panic(pick in 0usize..10_000, content in odd_content(), which in 0usize..2) {
        let c = &copies()[which];
        let target = &c.files[pick % c.files.len()];
        let original = std::fs::read(target).unwrap();
        std::fs::write(target, &content).unwrap();

        let (m, f) = host::discover(&c.root);
        std::fs::write(target, &original).unwrap();
        let devs = m.nccl_devices(&|_, _| true, &|_| true);
        let links = m.local_links(&devs);
        let _ = m.routes();
        let r = doctor::report(&m, &devs, f);
        let _ = doctor::render_text(&r);
        serde_json::to_string(&r).unwrap();
        serde_json::to_string(&m).unwrap();
        for (i, l) in links.iter().enumerate() {
            prop_assert_eq!(l.id, i);
        }
    }
}
