/*
 * read_loop: random 4 KiB reads at a fixed queue depth for a few seconds, polled, through
 * libvfpoll; prints the IOPS. The shape of an I/O engine's hot loop: buffers and the queue pair
 * made once, each completion resubmits its buffer (the tag says which), one doorbell per batch.
 *
 *   read_loop [-n] [-p 4k|2m|1g] PCI_ADDR [NSID [SECONDS [QUEUE_DEPTH]]]
 */
#define _POSIX_C_SOURCE 200809L
#include "example.h"

#include <inttypes.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* xorshift64*: the next random block. */
static uint64_t next_lba(uint64_t *s, uint64_t slots, uint64_t blocks_per_io)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (*s * 0x2545F4914F6CDD1DULL) % slots * blocks_per_io;
}

int main(int argc, char **argv)
{
    struct example_args a = parse_args(argc, argv, " [SECONDS [QUEUE_DEPTH]]");
    double seconds = a.nrest > 0 ? atof(a.rest[0]) : 3;
    unsigned qd = a.nrest > 1 ? (unsigned)atoi(a.rest[1]) : 32;
    if (qd < 1 || qd > 1024 || seconds <= 0)
        usage(argv[0], " [SECONDS [QUEUE_DEPTH (1..1024)]]");
    vfpoll_env *env;
    vfpoll_ctrl *ctrl;
    open_ctrl(&a, &env, &ctrl);

    vfpoll_ns_info ns;
    int rc = vfpoll_ns_identify(ctrl, a.nsid, &ns);
    if (rc < 0)
        die("vfpoll_ns_identify", rc);
    uint64_t per_io = ns.lba_size < 4096 ? 4096 / ns.lba_size : 1, len, mlen;
    rc = vfpoll_ns_transfer(ctrl, a.nsid, VFPOLL_PI_CONTROLLER, per_io, &len, &mlen);
    if (rc < 0)
        die("vfpoll_ns_transfer", rc);
    if (mlen) {
        fprintf(stderr, "read_loop: namespace %u keeps metadata in a separate buffer; "
                        "this example reads data only: pick another namespace\n", a.nsid);
        return 1;
    }
    uint64_t slots = ns.blocks / per_io;
    size_t size = 512;
    while (size < len)
        size *= 2;

    vfpoll_pool *pool;
    if ((rc = vfpoll_pool_create(ctrl, size, qd, &pool)) < 0)
        die("vfpoll_pool_create", rc);
    vfpoll_qpair_opts o;
    vfpoll_qpair_opts_init(&o);
    o.entries = qd + 1;
    vfpoll_qpair *qp;
    if ((rc = vfpoll_qpair_create(ctrl, &o, &qp)) < 0)
        die("vfpoll_qpair_create", rc);
    vfpoll_buf **bufs = calloc(qd, sizeof *bufs);
    vfpoll_completion *done = calloc(qd, sizeof *done);
    if (!bufs || !done)
        return 1;

    /* The tag of each read is its buffer's index. */
    uint64_t seed = 0x9e3779b97f4a7c15ULL, reads = 0, errors = 0;
    for (unsigned i = 0; i < qd; i++) {
        if ((rc = vfpoll_buf_alloc(pool, &bufs[i])) < 0)
            die("vfpoll_buf_alloc", rc);
        if ((rc = vfpoll_qpair_read(qp, a.nsid, next_lba(&seed, slots, per_io), bufs[i], len, i)) < 0)
            die("vfpoll_qpair_read", rc);
    }
    double start = now(), end = start + seconds, t = start;
    unsigned polls = 0;
    while (vfpoll_qpair_outstanding(qp) > 0) {
        int n = vfpoll_qpair_poll(qp, done, qd);
        if (n < 0)
            die("vfpoll_qpair_poll", n);
        /* The clock is read every 64 polls only: it costs more than an empty poll. */
        if (n > 0 || ++polls % 64 == 0)
            t = now();
        for (int i = 0; i < n; i++) {
            if (done[i].status != 0) {
                if (errors++ == 0)
                    fprintf(stderr, "read_loop: a read failed: status %d, NVMe status %#x\n", done[i].status,
                            done[i].nvme_status);
            }
            reads++;
            if (t < end) {
                rc = vfpoll_qpair_read(qp, a.nsid, next_lba(&seed, slots, per_io), bufs[done[i].tag], len,
                                       done[i].tag);
                if (rc < 0)
                    die("vfpoll_qpair_read", rc);
            }
        }
        /* Resubmissions are rung by the next poll: one doorbell per batch. */
    }
    double elapsed = now() - start;
    printf("read_loop: %s namespace %u: %" PRIu64 " reads of %" PRIu64 " B at queue depth %u in %.2f s: "
           "%.0f IOPS, %.1f MiB/s, %" PRIu64 " errors\n",
           a.pci_addr, a.nsid, reads, len, qd, elapsed, reads / elapsed, reads * len / elapsed / (1 << 20),
           errors);
    for (unsigned i = 0; i < qd; i++)
        if ((rc = vfpoll_buf_free(bufs[i])) < 0)
            die("vfpoll_buf_free", rc);
    if ((rc = vfpoll_qpair_destroy(qp)) < 0)
        die("vfpoll_qpair_destroy", rc);
    if ((rc = vfpoll_pool_destroy(pool)) < 0)
        die("vfpoll_pool_destroy", rc);
    free(bufs);
    free(done);
    vfpoll_ctrl_close(ctrl);
    vfpoll_env_close(env);
    return errors == 0 && reads > 0 ? 0 : 1;
}
