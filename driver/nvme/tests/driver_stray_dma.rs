//! Stray DMA is caught, not silent. A buffer that claims more bytes than its memory has (an
//! `IoBuffer` implementation with a bug) makes the driver describe a transfer that runs past the
//! end of its region. `vfpoll-dma` leaves an unmapped IOVA page after every mapping, so the
//! controller's access there faults instead of landing in the buffer allocated next: the command
//! fails with Data Transfer Error, the neighbour is untouched, and the fault (logged by the
//! model's IOMMU) fails the test at teardown unless the test takes it.

mod drv;

use std::sync::Arc;

use drv::*;
use vfpoll_dma::DmaRegion;
use vfpoll_nvme::IoBuffer;
use vfpoll_pci::BusAddr;

/// A buggy buffer: `len` bytes from the start of `region`, which has fewer.
struct Overlong {
    region: Arc<DmaRegion>,
    len: usize,
}

impl std::fmt::Debug for Overlong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Overlong({} of {} bytes)", self.len, self.region.len())
    }
}

// SAFETY: deliberately broken, which is the point of these tests: the bytes past the region's
// end have bus addresses the driver never mapped. Only the model uses them, and it translates
// every address through the fake IOMMU, which refuses unmapped ones, so no memory is touched.
unsafe impl IoBuffer for Overlong {
    fn len(&self) -> usize {
        self.len
    }
    fn bus_addr(&self, off: usize) -> BusAddr {
        BusAddr(self.region.bus_addr(0).get() + off as u64)
    }
    fn contiguous_len(&self, off: usize) -> usize {
        self.len - off
    }
}

/// A rig, a two-page region filled with 0xaa, the region allocated right after it (filled with
/// 0x55), and the bus address just past the first region's end.
fn setup() -> (Rig, Arc<DmaRegion>, DmaRegion, u64) {
    let rig = rig(small_cfg(1024, 5));
    rig.model.write_ns(1, 0, &pattern(3, 3 * PAGE)).unwrap();
    let buf = Arc::new(region(&rig.ctrl, 2 * PAGE, 0xaa));
    let neighbour = region(&rig.ctrl, PAGE, 0x55);
    let end = buf.bus_addr(2 * PAGE - 1).get() + 1;
    assert!(
        neighbour.bus_addr(0).get() > end,
        "the next mapping starts after a gap, not at {end:#x}"
    );
    (rig, buf, neighbour, end)
}

fn read_overlong(rig: &Rig, buf: &Arc<DmaRegion>) -> Result<u64, vfpoll_nvme::NvmeError> {
    let mut qp = rig.ctrl.create_qpair::<Overlong>(&qopts(8, HANG)).unwrap();
    let b = Overlong {
        region: buf.clone(),
        len: 3 * PAGE,
    };
    sync(&mut qp, |q, b| q.read(1, 0, b, 1), b).result
}

#[test]
fn an_overrun_past_a_buffer_faults_instead_of_landing_in_the_next_one() {
    let (rig, buf, neighbour, end) = setup();
    let r = read_overlong(&rig, &buf);
    assert_eq!(status_of(&r).name(), Some("Data Transfer Error"), "{r:?}");
    rig.expect_dma_faults(&[end]);
    let mut got = vec![0; PAGE];
    neighbour.read(0, &mut got).unwrap();
    assert_eq!(got, vec![0x55; PAGE], "the neighbour was written");
    // The same for a write: the controller would read past the end.
    let mut qp = rig.ctrl.create_qpair::<Overlong>(&qopts(8, HANG)).unwrap();
    let b = Overlong {
        region: buf.clone(),
        len: 3 * PAGE,
    };
    let before = rig.model.namespace_data(1).unwrap();
    let r = sync(&mut qp, |q, b| q.write(1, 0, b, 2), b).result;
    assert_eq!(status_of(&r).name(), Some("Data Transfer Error"), "{r:?}");
    rig.expect_dma_faults(&[end]);
    assert_eq!(rig.model.namespace_data(1).unwrap(), before, "nothing written");
}

#[test]
#[should_panic(expected = "DMA access(es) outside the host's mappings")]
fn an_overrun_nobody_looked_at_fails_the_test_at_teardown() {
    let (rig, buf, _neighbour, _) = setup();
    // The test sees an error status and moves on: the fault check at teardown still fails it.
    assert!(read_overlong(&rig, &buf).is_err());
}
