/*
 * identify: what an NVMe controller says about itself and its namespaces, through libvfpoll.
 *
 *   identify [-n] [-p 4k|2m|1g] PCI_ADDR
 */
#define _POSIX_C_SOURCE 200809L
#include "example.h"

#include <inttypes.h>

static const char *metadata_name(uint32_t md)
{
    switch (md) {
    case VFPOLL_MD_NONE:
        return "none";
    case VFPOLL_MD_EXTENDED:
        return "extended";
    case VFPOLL_MD_SEPARATE:
        return "separate";
    default:
        return "?";
    }
}

int main(int argc, char **argv)
{
    struct example_args a = parse_args(argc, argv, "");
    vfpoll_env *env;
    vfpoll_ctrl *ctrl;
    open_ctrl(&a, &env, &ctrl);

    vfpoll_ctrl_info c;
    int rc = vfpoll_ctrl_identify(ctrl, &c);
    if (rc < 0)
        die("vfpoll_ctrl_identify", rc);
    printf("controller %s\n", a.pci_addr);
    printf("  vid        %#06x\n", c.vid);
    printf("  serial     %s\n", c.serial);
    printf("  model      %s\n", c.model);
    printf("  firmware   %s\n", c.firmware);
    printf("  version    %u.%u.%u\n", c.version >> 16, (c.version >> 8) & 0xff, c.version & 0xff);
    printf("  mdts       %u (%" PRIu64 " bytes)\n", c.mdts, c.mdts_bytes);
    printf("  namespaces %u (NN %u)\n", c.active_namespaces, c.namespace_count);
    printf("  io queues  %u, up to %u entries\n", c.io_queues, c.max_queue_entries);
    printf("  write cache %s\n", c.volatile_write_cache ? "present" : "absent");

    uint32_t nsids[64];
    int n = vfpoll_ctrl_namespaces(ctrl, nsids, 64);
    if (n < 0)
        die("vfpoll_ctrl_namespaces", n);
    for (int i = 0; i < n && i < 64; i++) {
        vfpoll_ns_info ns;
        rc = vfpoll_ns_identify(ctrl, nsids[i], &ns);
        if (rc < 0)
            die("vfpoll_ns_identify", rc);
        printf("nsid %u: blocks=%" PRIu64 " lba_size=%u bytes=%" PRIu64 " metadata=%s/%u pi=%u",
               ns.nsid, ns.blocks, ns.lba_size, ns.bytes, metadata_name(ns.metadata),
               ns.metadata_size, ns.pi_type);
        if (ns.pi_type)
            printf(" guard=%u %s", ns.pi_guard_bits, ns.pi_first ? "first" : "last");
        printf(" lbaf=%u/%u zoned=%d", ns.lba_format, ns.lba_format_count, ns.zoned);
        if (ns.zoned)
            printf(" zone_size=%" PRIu64, ns.zone_size);
        /* What one 4 KiB-or-one-block I/O moves, or why the driver refuses the namespace. */
        uint64_t blocks = ns.lba_size < 4096 ? 4096 / ns.lba_size : 1, data, meta;
        rc = vfpoll_ns_transfer(ctrl, ns.nsid, VFPOLL_PI_CONTROLLER, blocks, &data, &meta);
        if (rc == 0)
            printf(" io=%" PRIu64 "+%" PRIu64 "\n", data, meta);
        else
            printf(" io=refused (%s)\n", vfpoll_last_error());
    }
    vfpoll_ctrl_close(ctrl);
    vfpoll_env_close(env);
    return 0;
}
