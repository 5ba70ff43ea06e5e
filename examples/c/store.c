/*
 * A checkpoint and a KV pool through libvfpoll's store API: format a store over the namespaces
 * named on the command line, commit a checkpoint of three entries, read it back whole and by
 * range, put and get KV blocks in batches, check the store, close it, open it again and read
 * once more.
 *
 * usage: vfpoll-c-store [-n] SPEC...
 *   -n    VFIO no-IOMMU mode for vfio: namespaces
 *   SPEC  vfio:0000:00:03.0/1, file:/data/a.img?size=256M, /dev/nvme0n1, ... (docs/store.md)
 * Everything on the namespaces is lost.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>

#include "example.h"

#define BIG (5u << 20) /* crosses several 1 MiB stripe chunks */
#define BLOCK (64u << 10)
#define BATCH 32

static void pattern(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void check(const char *what, const void *got, const void *want, size_t n)
{
    if (memcmp(got, want, n) != 0) {
        fprintf(stderr, "%s: the bytes read back differ from those written\n", what);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    struct vfpoll_store_opts opts;
    vfpoll_store_opts_init(&opts);
    int first = 1;
    if (argc > 1 && strcmp(argv[1], "-n") == 0) {
        opts.iommu_mode = VFPOLL_IOMMU_NONE;
        first = 2;
    }
    if (argc <= first) {
        fprintf(stderr, "usage: %s [-n] SPEC...\n", argv[0]);
        return 2;
    }
    const char *const *specs = (const char *const *)&argv[first];
    size_t n = (size_t)(argc - first);
    opts.force = 1;
    opts.label = "c example";

    uint8_t *big = malloc(BIG), *back = malloc(BIG), *blocks = malloc(BATCH * BLOCK),
            *out = malloc(BATCH * BLOCK);
    if (!big || !back || !blocks || !out) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    pattern(big, BIG, 1);
    pattern(blocks, BATCH * BLOCK, 2);
    uint64_t step = 1234;

    vfpoll_store *s;
    int rc = vfpoll_store_format(specs, n, &opts, &s);
    if (rc < 0)
        die("vfpoll_store_format", rc);

    /* A checkpoint: three entries, committed all or nothing. */
    vfpoll_ckpt_tx *tx;
    if ((rc = vfpoll_ckpt_begin(s, "model", &tx)) < 0)
        die("vfpoll_ckpt_begin", rc);
    const char meta[] = "u8[5242880]";
    if ((rc = vfpoll_ckpt_put(tx, "layers.0.weight", meta, sizeof meta - 1, big, BIG)) < 0)
        die("vfpoll_ckpt_put", rc);
    if ((rc = vfpoll_ckpt_put(tx, "step", NULL, 0, &step, sizeof step)) < 0)
        die("vfpoll_ckpt_put", rc);
    if ((rc = vfpoll_ckpt_put(tx, "empty", NULL, 0, NULL, 0)) < 0)
        die("vfpoll_ckpt_put", rc);
    if ((rc = vfpoll_ckpt_keep_last(tx, 2)) < 0)
        die("vfpoll_ckpt_keep_last", rc);
    uint64_t version = 0;
    if ((rc = vfpoll_ckpt_commit(tx, &version)) < 0)
        die("vfpoll_ckpt_commit", rc);
    printf("committed model version %llu\n", (unsigned long long)version);

    /* A KV pool: 64 KiB blocks, a batch of 32 put and got in one burst each. */
    vfpoll_kv_pool *pool;
    if ((rc = vfpoll_kv_create(s, "kv", BLOCK, 128, &pool)) < 0)
        die("vfpoll_kv_create", rc);
    vfpoll_kv_key keys[BATCH];
    const void *bufs[BATCH];
    void *outs[BATCH];
    size_t lens[BATCH];
    int64_t got[BATCH];
    for (int i = 0; i < BATCH; i++) {
        keys[i].lo = 0x1000u + (uint64_t)i;
        keys[i].hi = 0xfeedu;
        bufs[i] = blocks + (size_t)i * BLOCK;
        outs[i] = out + (size_t)i * BLOCK;
        lens[i] = BLOCK - (size_t)i; /* blocks may be shorter than the block size */
    }
    if ((rc = vfpoll_kv_put(pool, keys, bufs, lens, BATCH)) < 0)
        die("vfpoll_kv_put", rc);
    if ((rc = vfpoll_kv_sync(pool)) < 0)
        die("vfpoll_kv_sync", rc);
    if ((rc = vfpoll_kv_close(pool)) < 0)
        die("vfpoll_kv_close", rc);

    struct vfpoll_fsck_result fr;
    if ((rc = vfpoll_store_fsck(s, &fr)) != 0) {
        if (rc < 0)
            die("vfpoll_store_fsck", rc);
        fprintf(stderr, "fsck: %d finding(s), first: %s\n", rc, fr.first);
        return 1;
    }
    if ((rc = vfpoll_store_close(s)) < 0)
        die("vfpoll_store_close", rc);

    /* Open again (the specs in another order): the committed state is there. */
    const char **rev = malloc(n * sizeof *rev);
    if (!rev)
        return 1;
    for (size_t i = 0; i < n; i++)
        rev[i] = specs[n - 1 - i];
    if ((rc = vfpoll_store_open(rev, n, &opts, &s)) < 0)
        die("vfpoll_store_open", rc);
    free(rev);
    struct vfpoll_store_info info;
    if ((rc = vfpoll_store_get_info(s, &info)) < 0)
        die("vfpoll_store_get_info", rc);
    printf("store %s: %u namespace(s), %llu bytes, %llu free, generation %llu\n", info.uuid,
           info.members, (unsigned long long)info.capacity, (unsigned long long)info.free,
           (unsigned long long)info.generation);

    vfpoll_ckpt_reader *r;
    if ((rc = vfpoll_ckpt_open(s, "model", 0, &r)) < 0)
        die("vfpoll_ckpt_open", rc);
    uint64_t v = 0, len = 0;
    if ((rc = vfpoll_ckpt_stat(r, "layers.0.weight", &v, &len)) < 0)
        die("vfpoll_ckpt_stat", rc);
    if (v != version || len != BIG) {
        fprintf(stderr, "version %llu, length %llu: expected %llu, %u\n", (unsigned long long)v,
                (unsigned long long)len, (unsigned long long)version, BIG);
        return 1;
    }
    if ((rc = vfpoll_ckpt_read(r, "layers.0.weight", 0, back, BIG, 1)) < 0)
        die("vfpoll_ckpt_read", rc);
    check("layers.0.weight", back, big, BIG);
    /* A range across a chunk boundary, without the crc checks. */
    if ((rc = vfpoll_ckpt_read(r, "layers.0.weight", (1u << 20) - 100, back, 300, 0)) < 0)
        die("vfpoll_ckpt_read", rc);
    check("range", back, big + (1u << 20) - 100, 300);
    uint64_t step_back = 0;
    if ((rc = vfpoll_ckpt_read(r, "step", 0, &step_back, sizeof step_back, 1)) < 0)
        die("vfpoll_ckpt_read", rc);
    check("step", &step_back, &step, sizeof step);
    rc = vfpoll_ckpt_stat(r, "no-such-entry", NULL, NULL);
    if (rc != -ENOENT) {
        fprintf(stderr, "a missing entry gave %d, not -ENOENT\n", rc);
        return 1;
    }
    vfpoll_ckpt_close(r);

    /* The KV index was rebuilt from the slot headers: every key hits, an unknown one misses. */
    if ((rc = vfpoll_kv_open(s, "kv", &pool)) < 0)
        die("vfpoll_kv_open", rc);
    if ((rc = vfpoll_kv_get(pool, keys, outs, BLOCK, got, BATCH)) < 0)
        die("vfpoll_kv_get", rc);
    if (rc != BATCH) {
        fprintf(stderr, "%d of %d KV gets hit after reopening\n", rc, BATCH);
        return 1;
    }
    for (int i = 0; i < BATCH; i++) {
        if (got[i] != (int64_t)lens[i]) {
            fprintf(stderr, "KV block %d: %lld bytes, expected %zu\n", i, (long long)got[i], lens[i]);
            return 1;
        }
        check("KV block", outs[i], bufs[i], lens[i]);
    }
    vfpoll_kv_key unknown = {.lo = 1, .hi = 2};
    if ((rc = vfpoll_kv_get(pool, &unknown, outs, BLOCK, got, 1)) != 0 || got[0] != -1) {
        fprintf(stderr, "an unknown key did not miss (%d, %lld)\n", rc, (long long)got[0]);
        return 1;
    }
    struct vfpoll_kv_stats st;
    if ((rc = vfpoll_kv_get_stats(pool, &st)) < 0)
        die("vfpoll_kv_get_stats", rc);
    printf("kv: %llu of %llu slots used, %llu hits, %llu misses\n", (unsigned long long)st.used,
           (unsigned long long)st.slots, (unsigned long long)st.hits, (unsigned long long)st.misses);
    vfpoll_kv_close(pool);

    char list[512];
    if ((rc = vfpoll_store_list(s, list, sizeof list)) < 0)
        die("vfpoll_store_list", rc);
    printf("%s", list);
    /* A second open of the same store is refused while this one is open. */
    vfpoll_store *again;
    rc = vfpoll_store_open(specs, n, &opts, &again);
    if (rc >= 0) {
        fprintf(stderr, "a second open of the store succeeded\n");
        return 1;
    }
    printf("second open refused (%d): %s\n", rc, vfpoll_last_error());
    if ((rc = vfpoll_store_close(s)) < 0)
        die("vfpoll_store_close", rc);
    free(big);
    free(back);
    free(blocks);
    free(out);
    printf("ok\n");
    return 0;
}
