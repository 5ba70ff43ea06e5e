/*
 * What the libvfpoll examples share: command-line parsing and error reporting.
 *
 * Every example takes: [-n] [-p 4k|2m|1g] PCI_ADDR [NSID]
 *   -n        VFIO no-IOMMU mode (the device sees physical addresses; needs root and hugepages)
 *   -p SIZE   page size of the DMA memory (default 2m: hugepages)
 */
#ifndef VFPOLL_EXAMPLE_H
#define VFPOLL_EXAMPLE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <vfpoll.h>

struct example_args {
    uint32_t iommu_mode;
    uint32_t page_size;
    const char *pci_addr;
    uint32_t nsid;
    /* Arguments after PCI_ADDR and NSID. */
    char **rest;
    int nrest;
};

/* Prints what failed, the errno-style code and libvfpoll's message, then exits. */
static inline void die(const char *what, int rc)
{
    fprintf(stderr, "%s failed (%d): %s\n", what, rc, vfpoll_last_error());
    exit(1);
}

static inline void usage(const char *prog, const char *more)
{
    fprintf(stderr, "usage: %s [-n] [-p 4k|2m|1g] PCI_ADDR [NSID]%s\n", prog, more);
    exit(2);
}

static inline struct example_args parse_args(int argc, char **argv, const char *more)
{
    struct example_args a = { VFPOLL_IOMMU_TYPE1, VFPOLL_PAGE_2M, NULL, 1, NULL, 0 };
    int opt;
    while ((opt = getopt(argc, argv, "np:")) != -1) {
        switch (opt) {
        case 'n':
            a.iommu_mode = VFPOLL_IOMMU_NONE;
            break;
        case 'p':
            if (strcmp(optarg, "4k") == 0)
                a.page_size = VFPOLL_PAGE_4K;
            else if (strcmp(optarg, "2m") == 0)
                a.page_size = VFPOLL_PAGE_2M;
            else if (strcmp(optarg, "1g") == 0)
                a.page_size = VFPOLL_PAGE_1G;
            else
                usage(argv[0], more);
            break;
        default:
            usage(argv[0], more);
        }
    }
    if (optind >= argc)
        usage(argv[0], more);
    a.pci_addr = argv[optind++];
    if (optind < argc)
        a.nsid = (uint32_t)strtoul(argv[optind++], NULL, 0);
    a.rest = argv + optind;
    a.nrest = argc - optind;
    return a;
}

/* Opens the environment and the controller, or exits. */
static inline void open_ctrl(const struct example_args *a, vfpoll_env **env, vfpoll_ctrl **ctrl)
{
    int rc = vfpoll_env_open(a->iommu_mode, a->page_size, env);
    if (rc < 0)
        die("vfpoll_env_open", rc);
    rc = vfpoll_ctrl_open(*env, a->pci_addr, ctrl);
    if (rc < 0)
        die("vfpoll_ctrl_open", rc);
}

#endif
