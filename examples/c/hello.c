/*
 * hello: writes a pattern to a namespace through libvfpoll, reads it back into a poisoned
 * buffer, compares, and puts the original blocks back. Handles every format the driver does:
 * metadata at the end of each block (extended LBA) or in a separate buffer, and protection
 * information generated and checked by the controller (whose PI bytes are not compared).
 *
 *   hello [-n] [-p 4k|2m|1g] PCI_ADDR [NSID]
 *
 * Uses the namespace's last 4 KiB (or last block, if larger). Exit status 0 when the data
 * match, 1 otherwise.
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

/* Polls `qp` for the one request in flight; exits on a timeout or an error status. */
static void wait_one(vfpoll_qpair *qp, const char *what)
{
    vfpoll_completion c;
    double start = now();
    for (;;) {
        int n = vfpoll_qpair_poll(qp, &c, 1);
        if (n < 0)
            die("vfpoll_qpair_poll", n);
        if (n == 1)
            break;
        if (now() - start > 30) {
            fprintf(stderr, "hello: %s: no completion within 30 s\n", what);
            exit(1);
        }
    }
    if (c.status != 0) {
        fprintf(stderr, "hello: %s failed: status %d, NVMe status %#x\n", what, c.status, c.nvme_status);
        exit(1);
    }
}

struct io {
    vfpoll_qpair *qp;
    uint32_t nsid;
    uint64_t lba;
    size_t dlen, mlen;
};

/* Reads (write = 0) or writes the blocks through `data` (and `meta`, for separate metadata). */
static void transfer(const struct io *io, vfpoll_qpair *qp, int write, vfpoll_buf *data, vfpoll_buf *meta,
                     const char *what)
{
    int rc;
    if (io->mlen == 0)
        rc = write ? vfpoll_qpair_write(qp, io->nsid, io->lba, data, io->dlen, 1)
                   : vfpoll_qpair_read(qp, io->nsid, io->lba, data, io->dlen, 1);
    else
        rc = write ? vfpoll_qpair_write_md(qp, io->nsid, io->lba, data, io->dlen, meta, io->mlen, 1)
                   : vfpoll_qpair_read_md(qp, io->nsid, io->lba, data, io->dlen, meta, io->mlen, 1);
    if (rc < 0)
        die(what, rc);
    wait_one(qp, what);
}

static vfpoll_buf *take(vfpoll_pool *pool, const void *fill, size_t len)
{
    vfpoll_buf *b;
    int rc = vfpoll_buf_alloc(pool, &b);
    if (rc < 0)
        die("vfpoll_buf_alloc", rc);
    if (fill && (rc = vfpoll_buf_write(b, 0, fill, len)) < 0)
        die("vfpoll_buf_write", rc);
    return b;
}

static void copy_out(vfpoll_buf *b, void *dst, size_t len)
{
    int rc = vfpoll_buf_read(b, 0, dst, len);
    if (rc < 0)
        die("vfpoll_buf_read", rc);
}

int main(int argc, char **argv)
{
    struct example_args a = parse_args(argc, argv, "");
    vfpoll_env *env;
    vfpoll_ctrl *ctrl;
    open_ctrl(&a, &env, &ctrl);

    vfpoll_ns_info ns;
    int rc = vfpoll_ns_identify(ctrl, a.nsid, &ns);
    if (rc < 0)
        die("vfpoll_ns_identify", rc);
    if (ns.zoned) {
        fprintf(stderr, "hello: namespace %u is zoned: its blocks cannot be rewritten in place; "
                        "use a conventional namespace (or `vfpoll hello`, which appends)\n", a.nsid);
        return 1;
    }
    uint64_t blocks = ns.lba_size < 4096 ? 4096 / ns.lba_size : 1, dlen, mlen;
    rc = vfpoll_ns_transfer(ctrl, a.nsid, VFPOLL_PI_CONTROLLER, blocks, &dlen, &mlen);
    if (rc < 0)
        die("vfpoll_ns_transfer", rc);
    size_t size = 512;
    while (size < dlen || size < mlen)
        size *= 2;
    vfpoll_pool *pool;
    if ((rc = vfpoll_pool_create(ctrl, size, 6, &pool)) < 0)
        die("vfpoll_pool_create", rc);
    vfpoll_qpair *qp, *saver = NULL;
    if ((rc = vfpoll_qpair_create(ctrl, NULL, &qp)) < 0)
        die("vfpoll_qpair_create", rc);
    if (ns.pi_type) {
        /* The original blocks may never have been written with valid PI: read them unchecked. */
        vfpoll_qpair_opts o;
        vfpoll_qpair_opts_init(&o);
        o.pi_mode = VFPOLL_PI_CONTROLLER_UNCHECKED;
        if ((rc = vfpoll_qpair_create(ctrl, &o, &saver)) < 0)
            die("vfpoll_qpair_create", rc);
    }
    struct io io = { qp, a.nsid, ns.blocks - blocks, (size_t)dlen, (size_t)mlen };

    unsigned char *pattern = malloc(dlen), *mpattern = malloc(mlen + 1), *got = malloc(dlen),
                  *mgot = malloc(mlen + 1), *saved = malloc(dlen), *msaved = malloc(mlen + 1),
                  *poison = malloc(size);
    if (!pattern || !mpattern || !got || !mgot || !saved || !msaved || !poison) {
        fprintf(stderr, "hello: out of memory\n");
        return 1;
    }
    const char *text = "hello from libvfpoll, the C API of vfpoll! ";
    for (size_t i = 0; i < dlen; i++)
        pattern[i] = (unsigned char)text[i % strlen(text)];
    for (size_t i = 0; i < mlen; i++)
        mpattern[i] = (unsigned char)(i * 7 + 1);
    memset(poison, 0xee, size);

    /* Save the original blocks. */
    vfpoll_buf *d = take(pool, poison, size), *m = take(pool, poison, size);
    transfer(&io, saver ? saver : qp, 0, d, m, "reading the original blocks");
    copy_out(d, saved, dlen);
    copy_out(m, msaved, mlen);

    /* Write the pattern, then read it back into poisoned buffers. */
    vfpoll_buf *wd = take(pool, pattern, dlen), *wm = take(pool, mpattern, mlen);
    double t0 = now();
    transfer(&io, qp, 1, wd, wm, "writing");
    double t_write = now() - t0;
    vfpoll_buf *rd = take(pool, poison, size), *rm = take(pool, poison, size);
    t0 = now();
    transfer(&io, qp, 0, rd, rm, "reading back");
    double t_read = now() - t0;
    copy_out(rd, got, dlen);
    copy_out(rm, mgot, mlen);

    /* Compare what is ours: with PI, the controller owns the PI bytes of each block's metadata
     * (8 bytes, first or last), and writes them itself. */
    size_t ms = ns.metadata_size, lba = ns.lba_size, per_block = dlen / blocks;
    long bad = -1, mbad = -1;
    for (size_t i = 0; i < dlen && bad < 0; i++) {
        size_t off = i % per_block;
        int own = off < lba || !ns.pi_type || (ns.pi_first ? off - lba >= 8 : off - lba < ms - 8);
        if (own && got[i] != pattern[i])
            bad = (long)i;
    }
    for (size_t i = 0; i < mlen && mbad < 0; i++) {
        size_t off = i % ms;
        int own = !ns.pi_type || (ns.pi_first ? off >= 8 : off < ms - 8);
        if (own && mgot[i] != mpattern[i])
            mbad = (long)i;
    }

    /* Put the original blocks back (with valid PI now). */
    if ((rc = vfpoll_buf_write(d, 0, saved, dlen)) < 0 || (mlen && (rc = vfpoll_buf_write(m, 0, msaved, mlen)) < 0))
        die("vfpoll_buf_write", rc);
    transfer(&io, qp, 1, d, m, "restoring the original blocks");

    vfpoll_buf *all[] = { d, m, wd, wm, rd, rm };
    for (size_t i = 0; i < 6; i++)
        if ((rc = vfpoll_buf_free(all[i])) < 0)
            die("vfpoll_buf_free", rc);
    if ((rc = vfpoll_qpair_destroy(qp)) < 0 || (saver && (rc = vfpoll_qpair_destroy(saver)) < 0))
        die("vfpoll_qpair_destroy", rc);
    if ((rc = vfpoll_pool_destroy(pool)) < 0)
        die("vfpoll_pool_destroy", rc);

    printf("hello: %s namespace %u LBA %" PRIu64 "..%" PRIu64 ": wrote %zu B", a.pci_addr, a.nsid, io.lba,
           io.lba + blocks, io.dlen);
    if (mlen)
        printf(" + %zu B of metadata", io.mlen);
    printf(" in %.0f us, read back in %.0f us: %s\n", t_write * 1e6, t_read * 1e6,
           bad < 0 && mbad < 0 ? "data matches" : "DATA DIFFERS");
    if (bad >= 0)
        fprintf(stderr, "hello: data byte %ld reads %#04x, wrote %#04x\n", bad, got[bad], pattern[bad]);
    if (mbad >= 0)
        fprintf(stderr, "hello: metadata byte %ld reads %#04x, wrote %#04x\n", mbad, mgot[mbad], mpattern[mbad]);
    free(pattern), free(mpattern), free(got), free(mgot), free(saved), free(msaved), free(poison);
    vfpoll_ctrl_close(ctrl);
    vfpoll_env_close(env);
    return bad < 0 && mbad < 0 ? 0 : 1;
}
