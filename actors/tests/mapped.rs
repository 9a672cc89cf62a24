//! The mapped placement serves the same experts, with the same bytes, as
//! the reference reader: in place from the mapping, decoded once, and
//! copied only when an expert's pieces lie in several files.

mod common;

use std::sync::Arc;

use colibri_actors::{
    BlockingSource, ExpertExtent, ExpertKey, ExpertSource, MappedSource, Piece, SourceError, Tag,
};
use common::{Fixture, run_workload, with_timeout};

#[test]
fn mapped_source_delivers_what_the_reference_reads() {
    with_timeout(60, || {
        let fx = Fixture::new(4, 16);
        let reference = {
            let src = BlockingSource::open(fx.map.clone(), fx.decoder()).expect("open");
            run_workload(&src, &fx, 11, 5, 4)
        };
        for readahead in [false, true] {
            let src = MappedSource::open(fx.map.clone(), fx.decoder(), None, readahead).expect("open");
            assert_eq!(run_workload(&src, &fx, 11, 5, 4), reference);
            // Decoded once: a second pass is all hits, and they are the very
            // same values.
            let p = src.profile();
            assert_eq!(p.placement, "mapped");
            assert_eq!(p.hits + p.misses, 4 * 5 * 4);
            let again = run_workload(&src, &fx, 11, 5, 4);
            assert_eq!(again, reference);
            assert_eq!(src.profile().misses, p.misses);
        }
    });
}

#[test]
fn an_expert_split_over_files_is_copied_once_and_still_right() {
    with_timeout(60, || {
        let fx = Fixture::new(2, 4);
        let key = ExpertKey::new(1, 2);
        // Move the expert's last piece into a third file of its own.
        let mut map = fx.map.clone();
        let ext = map.extent(key).expect("extent").clone();
        let last = *ext.pieces.last().expect("pieces");
        let bytes = std::fs::read(&map.files[last.file as usize]).expect("read fixture");
        let third = fx.dir.path().join("experts-2.bin");
        std::fs::write(
            &third,
            &bytes[last.offset as usize..(last.offset + last.len) as usize],
        )
        .expect("write");
        map.files.push(third);
        let mut pieces = ext.pieces.clone();
        *pieces.last_mut().expect("pieces") = Piece {
            file: 2,
            offset: 0,
            len: last.len,
        };
        map.set_extent(key, ExpertExtent { pieces }).expect("in range");

        let src = MappedSource::open(map, fx.decoder(), None, false).expect("open");
        let mut got = Vec::new();
        src.fetch(Tag::new(0, 0, 1), &[key], &mut |_, e| {
            got.push((e.key, e.checksum));
            Ok(())
        })
        .expect("fetch");
        assert_eq!(got, vec![(key, fx.expected(key))]);
    });
}

#[test]
fn unknown_experts_and_truncated_files_are_errors_not_panics() {
    with_timeout(60, || {
        let fx = Fixture::new(2, 4);
        let src = MappedSource::open(fx.map.clone(), fx.decoder(), None, false).expect("open");
        let r = src.fetch(Tag::new(0, 0, 0), &[ExpertKey::new(9, 0)], &mut |_, _| Ok(()));
        assert!(matches!(r, Err(SourceError::UnknownExpert { .. })), "{r:?}");

        // A piece that points past the end of its file.
        let mut map = fx.map.clone();
        let key = ExpertKey::new(0, 1);
        let mut ext = map.extent(key).expect("extent").clone();
        ext.pieces[0].offset = 1 << 40;
        map.set_extent(key, ext).expect("in range");
        let src = MappedSource::open(map, fx.decoder(), None, false).expect("open");
        let r = src.fetch(Tag::new(0, 0, 0), &[key], &mut |_, _| Ok(()));
        match r {
            Err(SourceError::Read { key: k, .. }) => assert_eq!(k, key),
            other => panic!("expected a read error, got {other:?}"),
        }
    });
}

#[test]
fn sink_errors_reach_the_caller() {
    with_timeout(60, || {
        let fx = Arc::new(Fixture::new(1, 4));
        let src = MappedSource::open(fx.map.clone(), fx.decoder(), None, false).expect("open");
        let keys = [ExpertKey::new(0, 0), ExpertKey::new(0, 3)];
        let r = src.fetch_batch(Tag::new(0, 0, 0), &keys, &mut |group| {
            // Both experts arrive in one group.
            assert_eq!(group.len(), 2);
            Err(SourceError::Compute("stop".into()))
        });
        assert!(matches!(r, Err(SourceError::Compute(_))), "{r:?}");
    });
}
