// SPDX-License-Identifier: GPL-2.0-only
/*
 * libvfpoll_fio.so: a fio external I/O engine over libvfpoll, vfpoll's polled userspace NVMe
 * driver (VFIO). It is built against fio's own headers (GPL-2.0), hence this licence; see
 * fio-engine/COPYING.
 *
 *   fio --thread --ioengine=external:/path/libvfpoll_fio.so --filename=0000.00.04.0/1 ...
 *
 * File names: DDDD.BB.DD.F/NSID, the PCI address of a controller bound to vfio-pci with its
 * colons written as dots (fio splits file names on ':'), then the namespace ID ("/1" may be
 * left out). Engine options: vfpoll_iommu=auto|iommufd|type1|none (VFIO's IOMMU backend,
 * default auto: iommufd where /dev/iommu and VFIO device cdevs exist, type1 otherwise),
 * vfpoll_page=2m|1g|4k (DMA page size, default 2m: hugepages), vfpoll_sgl=1 (SGLs, not PRPs),
 * vfpoll_stats=1 (print each queue pair's counters when the job ends: doorbells, polls).
 *
 * How it maps onto libvfpoll's rules (one queue pair and one buffer pool per thread):
 *   - one environment per process and one controller handle per PCI address, opened by the
 *     first job that names it (in fio's setup(), which runs in fio's main thread) and closed
 *     when the last job using it ends;
 *   - each job (thread) has its own queue pair per controller and its own pool;
 *   - fio's I/O buffers ARE the pool's DMA buffers (fio's iomem_alloc hook): io_u i's buffer is
 *     pool buffer i, so data never gets copied. That needs the largest block size to be a power
 *     of two (fio lays the buffers out max_bs apart) and no mem_align; otherwise fio's buffers
 *     are ordinary memory and each I/O goes through a DMA bounce buffer (fio prints a note);
 *   - an io_u's tag is its index; completions are polled in getevents(), never waited for;
 *   - fio reaps one completion per getevents() by default (iodepth_batch_complete_max=1):
 *     one poll takes every completion the queue pairs have and keeps those fio did not ask for
 *     yet for its next calls, and commit() leaves the doorbell to that poll unless the
 *     controller would idle, so a deep queue costs one poll and about one doorbell per batch
 *     rather than per I/O (fio's batching options still apply on top).
 * thread=1 is required: fio's default (a process per job) would fork after the controller was
 * opened, and a VFIO device cannot be shared by two processes.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fio.h"
#include "optgroup.h"

#include <vfpoll.h>

#define ENGINE "vfpoll"

/* Options of a job; fio keeps the thread_data pointer in the first member. */
struct vfp_options {
	void *pad;
	char *iommu;
	char *page;
	unsigned int sgl;
	unsigned int stats;
};

static struct fio_option options[] = {
	{
		.name = "vfpoll_iommu",
		.lname = "vfpoll IOMMU mode",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct vfp_options, iommu),
		.help = "IOMMU backend: auto (default: iommufd where the kernel offers it, type1 otherwise), iommufd, type1 or none (no-IOMMU mode)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "vfpoll_page",
		.lname = "vfpoll DMA page size",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct vfp_options, page),
		.help = "Page size of the DMA memory: 2m (hugepages, default), 1g or 4k",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "vfpoll_sgl",
		.lname = "vfpoll SGLs",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct vfp_options, sgl),
		.help = "Describe data with SGLs where the controller supports them (default: PRPs)",
		.def = "0",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "vfpoll_stats",
		.lname = "vfpoll counters",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct vfp_options, stats),
		.help = "Print each queue pair's counters when the job ends (MMIO doorbells, polls)",
		.def = "0",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* An open controller, shared by every job of the process that names it. */
struct vfp_ctrl {
	struct vfp_ctrl *next;
	char pci[16];
	vfpoll_ctrl *ctrl;
	vfpoll_ctrl_info info;
	/* Files (of all jobs) that use it. */
	unsigned int users;
};

/* The process's environment and controllers, under g_lock. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static vfpoll_env *g_env;
static uint32_t g_iommu, g_page;
static struct vfp_ctrl *g_ctrls;

struct vfp_td;

/* A file of a job: one namespace of a controller (fio_file's engine data). */
struct vfp_file {
	struct vfp_td *s;
	struct vfp_ctrl *c;
	uint32_t nsid;
	uint32_t lba_size;
	unsigned int lba_shift;
	uint64_t blocks;
	/* Index of the job's queue pair on this controller. */
	unsigned int q;
};

/* A queue pair of a job. */
struct vfp_qp {
	struct vfp_ctrl *c;
	vfpoll_qpair *qp;
	/* Queued since the last doorbell. */
	unsigned int pending;
	/* Queued and not yet returned by a poll (vfpoll_qpair_outstanding without a call). */
	unsigned int inflight;
};

/* An io_u of a job, by io_u->index (the tag of its command). */
struct vfp_io {
	struct io_u *io_u;
	/* The bounce buffer of the I/O in flight (NULL: zero-copy, or no data). */
	vfpoll_buf *bounce;
	/* The NVMe status of the last failed command, for errdetails(). */
	uint16_t nvme_status;
};

/* A job's engine state (td->io_ops_data). */
struct vfp_td {
	struct vfp_file **files;
	unsigned int nfiles;
	struct vfp_qp *qps;
	unsigned int nqps;
	struct vfp_io *ios;
	unsigned int nios;
	struct io_u **events;
	vfpoll_completion *comps;
	unsigned int rr;
	/* Completions polled but not yet handed to fio: comps[stash_at..stash_at + stashed]. */
	unsigned int stash_at, stashed;

	/* DMA memory: zero-copy (fio's buffers are the pool's) or a bounce pool. */
	vfpoll_pool *pool;
	vfpoll_buf **bufs;
	unsigned int nbufs;
	char *base;
	size_t buf_size;
	bool zero_copy;
	/* fio's own buffers when not zero-copy. */
	void *plain;
};

/* Logs what failed, with libvfpoll's message. */
static void vfp_err(const char *what, int rc)
{
	log_err(ENGINE ": %s failed (%d, %s): %s\n", what, rc, strerror(-rc), vfpoll_last_error());
}

static bool is_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') ||
		      (s[i] >= 'A' && s[i] <= 'F')))
			return false;
	return true;
}

/*
 * Parses "DDDD.BB.DD.F[/NSID]" (':' also accepted in place of the first two dots, for a name
 * fio was given with escaped colons) into a PCI address "DDDD:BB:DD.F" and a namespace ID.
 */
static bool parse_name(const char *name, char pci[16], uint32_t *nsid)
{
	size_t n = strcspn(name, "/");
	if (n != 12 || !is_hex(name, 4) || (name[4] != '.' && name[4] != ':') || !is_hex(name + 5, 2) ||
	    (name[7] != '.' && name[7] != ':') || !is_hex(name + 8, 2) || name[10] != '.' ||
	    name[11] < '0' || name[11] > '7')
		return false;
	snprintf(pci, 16, "%.4s:%.2s:%.2s.%c", name, name + 5, name + 8, name[11]);
	*nsid = 1;
	if (name[n] == '/') {
		const char *p = name + n + 1;
		char *end;
		errno = 0;
		unsigned long v = strtoul(p, &end, 10);
		if (*p < '0' || *p > '9' || *end || errno || v < 1 || v > 0xfffffffeUL)
			return false;
		*nsid = (uint32_t)v;
	}
	return true;
}

static int parse_opts(struct thread_data *td, uint32_t *iommu, uint32_t *page)
{
	struct vfp_options *o = td->eo;
	const char *m = o && o->iommu ? o->iommu : "auto";
	const char *p = o && o->page ? o->page : "2m";
	if (!strcmp(m, "auto"))
		*iommu = VFPOLL_IOMMU_AUTO;
	else if (!strcmp(m, "iommufd"))
		*iommu = VFPOLL_IOMMU_IOMMUFD;
	else if (!strcmp(m, "type1"))
		*iommu = VFPOLL_IOMMU_TYPE1;
	else if (!strcmp(m, "none") || !strcmp(m, "noiommu"))
		*iommu = VFPOLL_IOMMU_NONE;
	else {
		log_err(ENGINE ": vfpoll_iommu=%s: say auto, iommufd, type1 (through the IOMMU) or none (VFIO no-IOMMU mode)\n", m);
		return 1;
	}
	if (!strcasecmp(p, "2m"))
		*page = VFPOLL_PAGE_2M;
	else if (!strcasecmp(p, "1g"))
		*page = VFPOLL_PAGE_1G;
	else if (!strcasecmp(p, "4k"))
		*page = VFPOLL_PAGE_4K;
	else {
		log_err(ENGINE ": vfpoll_page=%s: say 2m, 1g or 4k\n", p);
		return 1;
	}
	return 0;
}

static uint64_t page_bytes(uint32_t page)
{
	return page == VFPOLL_PAGE_1G ? 1ULL << 30 : page == VFPOLL_PAGE_4K ? 4096 : 2ULL << 20;
}

/* The controller at `pci`, opened on first use (g_lock held). */
static struct vfp_ctrl *get_ctrl(struct thread_data *td, const char *pci)
{
	uint32_t iommu, page;
	if (parse_opts(td, &iommu, &page))
		return NULL;
	if (!g_env) {
		int rc = vfpoll_env_open(iommu, page, &g_env);
		if (rc < 0) {
			vfp_err("vfpoll_env_open", rc);
			return NULL;
		}
		g_iommu = iommu;
		g_page = page;
	} else if (iommu != g_iommu || page != g_page) {
		log_err(ENGINE ": job %s asks for vfpoll_iommu=%s vfpoll_page=%s, but an earlier job of this "
			"fio process opened vfpoll's environment with other settings: all jobs share one, "
			"give them the same vfpoll_iommu and vfpoll_page\n",
			td->o.name,
			iommu == VFPOLL_IOMMU_NONE ? "none" : iommu == VFPOLL_IOMMU_IOMMUFD ? "iommufd"
				: iommu == VFPOLL_IOMMU_AUTO ? "auto" : "type1",
			page == VFPOLL_PAGE_1G ? "1g" : page == VFPOLL_PAGE_4K ? "4k" : "2m");
		return NULL;
	}
	for (struct vfp_ctrl *c = g_ctrls; c; c = c->next)
		if (!strcmp(c->pci, pci))
			return c;
	struct vfp_ctrl *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	snprintf(c->pci, sizeof(c->pci), "%s", pci);
	int rc = vfpoll_ctrl_open(g_env, pci, &c->ctrl);
	if (rc == 0 && (rc = vfpoll_ctrl_identify(c->ctrl, &c->info)) < 0)
		vfpoll_ctrl_close(c->ctrl);
	if (rc < 0) {
		vfp_err(rc == -ENOENT || !c->ctrl ? "vfpoll_ctrl_open" : "vfpoll_ctrl_identify", rc);
		free(c);
		return NULL;
	}
	c->next = g_ctrls;
	g_ctrls = c;
	return c;
}

/* Drops one user of `c`; the last one closes it, and the environment with the last controller. */
static void put_ctrl(struct vfp_ctrl *c)
{
	pthread_mutex_lock(&g_lock);
	if (--c->users == 0) {
		for (struct vfp_ctrl **p = &g_ctrls; *p; p = &(*p)->next)
			if (*p == c) {
				*p = c->next;
				break;
			}
		int rc = vfpoll_ctrl_close(c->ctrl);
		if (rc < 0)
			vfp_err("vfpoll_ctrl_close", rc);
		free(c);
		if (!g_ctrls) {
			vfpoll_env_close(g_env);
			g_env = NULL;
		}
	}
	pthread_mutex_unlock(&g_lock);
}

static bool check_thread(struct thread_data *td)
{
	if (td->o.use_thread)
		return true;
	log_err(ENGINE ": job %s: the vfpoll engine needs thread=1 (--thread): its jobs share one VFIO "
		"environment and controller, which cannot be shared by the processes fio forks by default\n",
		td->o.name);
	return false;
}

/* The job's engine state, made on first use (setup() in fio's main thread, or init()). */
static struct vfp_td *state(struct thread_data *td)
{
	if (!td->io_ops_data) {
		struct vfp_td *s = calloc(1, sizeof(*s));
		if (s) {
			s->files = calloc(td->o.nr_files ? td->o.nr_files : 1, sizeof(*s->files));
			if (!s->files) {
				free(s);
				s = NULL;
			}
		}
		td->io_ops_data = s;
	}
	return td->io_ops_data;
}

/* Block sizes and alignments must be whole blocks of the namespace. */
static bool check_geometry(struct thread_data *td, const struct fio_file *f, uint32_t lba)
{
	if (td->o.bs_unaligned) {
		log_err(ENGINE ": %s: bs_unaligned is not supported: every I/O is whole blocks of %u bytes\n",
			f->file_name, lba);
		return false;
	}
	for (int d = DDIR_READ; d <= DDIR_TRIM; d++) {
		if (td->o.min_bs[d] % lba || td->o.max_bs[d] % lba || td->o.ba[d] % lba) {
			log_err(ENGINE ": %s: the namespace's block size is %u bytes: bs (%llu..%llu) and "
				"blockalign (%llu) must be multiples of it\n",
				f->file_name, lba, td->o.min_bs[d], td->o.max_bs[d], td->o.ba[d]);
			return false;
		}
	}
	if (td->o.start_offset % lba) {
		log_err(ENGINE ": %s: offset=%llu is not a multiple of the block size (%u)\n", f->file_name,
			td->o.start_offset, lba);
		return false;
	}
	uint64_t page = page_bytes(g_page);
	if (td_max_bs(td) > page) {
		log_err(ENGINE ": %s: bs=%llu is larger than a DMA buffer can be (the page size, %" PRIu64
			" bytes): use vfpoll_page=1g or smaller blocks\n",
			f->file_name, td_max_bs(td), page);
		return false;
	}
	return true;
}

/*
 * Opens (or finds) the file's controller and checks its namespace: a format whose blocks carry
 * only data through the data buffer (no metadata, or PI that the controller inserts and
 * strips), not zoned, one the driver accepts.
 */
static int attach_file(struct thread_data *td, struct vfp_td *s, struct fio_file *f)
{
	char pci[16];
	uint32_t nsid;
	if (FILE_ENG_DATA(f))
		return 0;
	if (!parse_name(f->file_name, pci, &nsid)) {
		log_err(ENGINE ": bad filename '%s': name a controller and a namespace as DDDD.BB.DD.F/NSID, "
			"e.g. 0000.00.04.0/1 for namespace 1 of 0000:00:04.0 (fio splits file names on ':', so "
			"the PCI address is written with dots)\n",
			f->file_name);
		return 1;
	}
	pthread_mutex_lock(&g_lock);
	struct vfp_ctrl *c = get_ctrl(td, pci);
	if (c)
		c->users++;
	pthread_mutex_unlock(&g_lock);
	if (!c)
		return 1;

	vfpoll_ns_info ns;
	uint64_t data = 0, meta = 0;
	int rc = vfpoll_ns_identify(c->ctrl, nsid, &ns);
	if (rc < 0) {
		vfp_err("vfpoll_ns_identify", rc);
		goto fail;
	}
	if (ns.zoned) {
		log_err(ENGINE ": %s: namespace %u of %s is zoned: this engine drives conventional "
			"namespaces only\n", f->file_name, nsid, pci);
		goto fail;
	}
	rc = vfpoll_ns_transfer(c->ctrl, nsid, VFPOLL_PI_CONTROLLER, 1, &data, &meta);
	if (rc < 0) {
		/* The driver refuses the format; its message says why. */
		log_err(ENGINE ": %s: namespace %u of %s cannot be used: %s\n", f->file_name, nsid, pci,
			vfpoll_last_error());
		goto fail;
	}
	if (meta || data != ns.lba_size) {
		log_err(ENGINE ": %s: namespace %u of %s keeps %u bytes of metadata with each %u-byte block "
			"(%s): fio's offsets and buffers are data only; use a format without metadata, or "
			"with protection information alone (the controller inserts and strips it)\n",
			f->file_name, nsid, pci, ns.metadata_size, ns.lba_size,
			meta ? "in a separate buffer" : "in the data buffer");
		goto fail;
	}
	if (!check_geometry(td, f, ns.lba_size))
		goto fail;

	struct vfp_file *vf = calloc(1, sizeof(*vf));
	if (!vf)
		goto fail;
	vf->s = s;
	vf->c = c;
	vf->nsid = nsid;
	vf->lba_size = ns.lba_size;
	vf->lba_shift = (unsigned int)__builtin_ctz(ns.lba_size);
	vf->blocks = ns.blocks;
	s->files[s->nfiles++] = vf;
	FILE_SET_ENG_DATA(f, vf);
	f->filetype = FIO_TYPE_BLOCK;
	f->real_file_size = ns.bytes;
	fio_file_set_size_known(f);
	return 0;
fail:
	put_ctrl(c);
	return 1;
}

static int attach_files(struct thread_data *td)
{
	struct vfp_td *s = state(td);
	struct fio_file *f;
	unsigned int i;
	if (!s)
		return 1;
	for_each_file(td, f, i) {
		if (s->nfiles >= td->o.nr_files && !FILE_ENG_DATA(f)) {
			log_err(ENGINE ": job %s has more files than nrfiles=%u\n", td->o.name, td->o.nr_files);
			return 1;
		}
		if (attach_file(td, s, f))
			return 1;
	}
	return 0;
}

/* fio's setup(), in its main thread before the jobs start: controllers, namespaces, sizes. */
static int vfp_setup(struct thread_data *td)
{
	if (!check_thread(td))
		return 1;
	return attach_files(td);
}

/* In the job's thread: its queue pairs, one per controller it uses. */
static int vfp_init(struct thread_data *td)
{
	if (!check_thread(td) || attach_files(td))
		return 1;
	struct vfp_td *s = td->io_ops_data;
	unsigned int depth = td->o.iodepth ? td->o.iodepth : 1;
	s->qps = calloc(s->nfiles ? s->nfiles : 1, sizeof(*s->qps));
	s->ios = calloc(depth, sizeof(*s->ios));
	s->events = calloc(depth, sizeof(*s->events));
	s->comps = calloc(depth, sizeof(*s->comps));
	if (!s->qps || !s->ios || !s->events || !s->comps)
		return 1;
	s->nios = depth;
	struct vfp_options *o = td->eo;
	for (unsigned int i = 0; i < s->nfiles; i++) {
		struct vfp_file *vf = s->files[i];
		unsigned int q = 0;
		while (q < s->nqps && s->qps[q].c != vf->c)
			q++;
		vf->q = q;
		if (q < s->nqps)
			continue;
		vfpoll_qpair_opts qo;
		vfpoll_qpair_opts_init(&qo);
		/*
		 * Room for the whole depth (a full queue would only send fio around again), and at
		 * least the default 256 entries, as vfpoll perf takes: the completion doorbell is
		 * rung once completions not yet announced plus commands in flight reach half the
		 * queue, so a queue of depth + 1 entries rang it at every poll that found one (0.065
		 * MMIO writes per I/O at depth 32 on the test bed, against 0.01 for vfpoll perf).
		 */
		unsigned int want = depth + 1 > qo.entries ? depth + 1 : qo.entries;
		qo.entries = want < vf->c->info.max_queue_entries ? want : vf->c->info.max_queue_entries;
		qo.sgl = o && o->sgl;
		int rc = vfpoll_qpair_create(vf->c->ctrl, &qo, &s->qps[q].qp);
		if (rc < 0) {
			log_err(ENGINE ": job %s: no queue pair on %s (%d): %s\n", td->o.name, vf->c->pci, rc,
				vfpoll_last_error());
			return 1;
		}
		s->qps[q].c = vf->c;
		s->nqps++;
	}
	return 0;
}

static int vfp_io_u_init(struct thread_data *td, struct io_u *io_u)
{
	struct vfp_td *s = td->io_ops_data;
	/* io_u->index is fio's (set before this call); engine_data shares its union, so stays unused. */
	if (!s || io_u->index >= s->nios)
		return 1;
	s->ios[io_u->index].io_u = io_u;
	return 0;
}

/* Buffers per power of two, at least 512 bytes. */
static size_t pow2_at_least(unsigned long long n)
{
	size_t s = 512;
	while (s < n)
		s *= 2;
	return s;
}

/*
 * fio's I/O memory. Zero-copy when fio will lay its io_u buffers out on pool buffer boundaries
 * (max_bs a power of two, no mem_align): the pool's buffers are one virtually contiguous region,
 * so fio's buffer i is pool buffer i. Otherwise ordinary memory plus a bounce pool.
 */
static int vfp_iomem_alloc(struct thread_data *td, size_t total)
{
	struct vfp_td *s = td->io_ops_data;
	if (!s || !s->nqps)
		return 1;
	vfpoll_ctrl *ctrl = s->qps[0].c->ctrl;
	unsigned long long max_bs = td_max_bs(td);
	size_t size = pow2_at_least(max_bs);
	int rc;
	s->buf_size = size;
	s->zero_copy = size == max_bs && !td->o.mem_align;
	if (s->zero_copy) {
		unsigned int count = (unsigned int)((total + size - 1) / size);
		s->bufs = calloc(count, sizeof(*s->bufs));
		if (!s->bufs)
			return 1;
		if ((rc = vfpoll_pool_create(ctrl, size, count, &s->pool)) < 0) {
			vfp_err("vfpoll_pool_create", rc);
			return 1;
		}
		for (unsigned int i = 0; i < count; i++) {
			if ((rc = vfpoll_buf_alloc(s->pool, &s->bufs[i])) < 0) {
				vfp_err("vfpoll_buf_alloc", rc);
				return 1;
			}
			s->nbufs++;
			char *p = vfpoll_buf_data(s->bufs[i]);
			if (i == 0)
				s->base = p;
			if (p != s->base + (size_t)i * size) {
				log_err(ENGINE ": the pool's buffers are not contiguous: cannot lend them to fio\n");
				return 1;
			}
		}
		td->orig_buffer = s->base;
		return 0;
	}
	log_info(ENGINE ": job %s: fio's buffers are ordinary memory, each I/O is copied through a DMA "
		 "buffer (zero-copy needs the largest bs to be a power of two and no mem_align; bs max "
		 "%llu, mem_align %u)\n",
		 td->o.name, max_bs, td->o.mem_align);
	if ((rc = vfpoll_pool_create(ctrl, size, s->nios, &s->pool)) < 0) {
		vfp_err("vfpoll_pool_create", rc);
		return 1;
	}
	if (posix_memalign(&s->plain, 4096, total))
		return 1;
	td->orig_buffer = s->plain;
	return 0;
}

/* Polls every queue pair until nothing is in flight (commands that hang time out). */
static void drain(struct vfp_td *s)
{
	for (unsigned int q = 0; q < s->nqps; q++) {
		vfpoll_completion c[16];
		while (vfpoll_qpair_outstanding(s->qps[q].qp) > 0) {
			int n = vfpoll_qpair_poll(s->qps[q].qp, c, 16);
			if (n < 0) {
				vfp_err("vfpoll_qpair_poll", n);
				break;
			}
			for (int i = 0; i < n; i++) {
				struct vfp_io *io = &s->ios[c[i].tag];
				if (io->bounce) {
					vfpoll_buf_free(io->bounce);
					io->bounce = NULL;
				}
			}
		}
		s->qps[q].inflight = s->qps[q].pending = 0;
	}
}

static void vfp_iomem_free(struct thread_data *td)
{
	struct vfp_td *s = td->io_ops_data;
	if (!s)
		return;
	drain(s);
	for (unsigned int i = 0; i < s->nbufs; i++)
		if (s->bufs[i])
			vfpoll_buf_free(s->bufs[i]);
	if (s->pool) {
		int rc = vfpoll_pool_destroy(s->pool);
		if (rc < 0)
			vfp_err("vfpoll_pool_destroy", rc);
	}
	free(s->bufs);
	free(s->plain);
	s->bufs = NULL;
	s->nbufs = 0;
	s->base = NULL;
	s->plain = NULL;
	s->pool = NULL;
	td->orig_buffer = NULL;
}

/* The DMA buffer of a read or write: fio's own (zero-copy) or a bounce buffer. */
static int data_buf(struct vfp_td *s, struct io_u *io_u, struct vfp_io *io, vfpoll_buf **out)
{
	unsigned long long len = io_u->xfer_buflen;
	if (s->zero_copy) {
		size_t off = (size_t)((char *)io_u->xfer_buf - s->base);
		size_t i = off / s->buf_size;
		if ((char *)io_u->xfer_buf < s->base || off % s->buf_size || i >= s->nbufs ||
		    len > s->buf_size || !s->bufs[i]) {
			log_err(ENGINE ": an I/O buffer (%p, %llu bytes) is not one of the DMA buffers lent "
				"to fio (or its buffer was lost after a controller failure)\n",
				io_u->xfer_buf, len);
			return -EINVAL;
		}
		*out = s->bufs[i];
		return 0;
	}
	if (!s->pool)
		return -EINVAL;
	int rc = vfpoll_buf_alloc(s->pool, &io->bounce);
	if (rc < 0)
		return rc;
	if (io_u->ddir == DDIR_WRITE && (rc = vfpoll_buf_write(io->bounce, 0, io_u->xfer_buf, len)) < 0) {
		vfpoll_buf_free(io->bounce);
		io->bounce = NULL;
		return rc;
	}
	*out = io->bounce;
	return 0;
}

static enum fio_q_status vfp_queue(struct thread_data *td, struct io_u *io_u)
{
	struct vfp_td *s = td->io_ops_data;
	struct vfp_file *vf = FILE_ENG_DATA(io_u->file);
	struct vfp_qp *q = &s->qps[vf->q];
	struct vfp_io *io = &s->ios[io_u->index];
	uint64_t tag = io_u->index;
	unsigned long long off = io_u->offset, len = io_u->xfer_buflen;
	int rc;

	fio_ro_check(td, io_u);
	io->nvme_status = 0;
	if (ddir_rw(io_u->ddir) || io_u->ddir == DDIR_TRIM) {
		if ((off | len) & (vf->lba_size - 1) || !len) {
			log_err(ENGINE ": %s: I/O at %llu of %llu bytes is not whole blocks of %u bytes\n",
				io_u->file->file_name, off, len, vf->lba_size);
			io_u->error = EINVAL;
			return FIO_Q_COMPLETED;
		}
	}
	switch (io_u->ddir) {
	case DDIR_READ:
	case DDIR_WRITE: {
		vfpoll_buf *b;
		rc = data_buf(s, io_u, io, &b);
		if (rc == 0) {
			if (io_u->ddir == DDIR_READ)
				rc = vfpoll_qpair_read(q->qp, vf->nsid, off >> vf->lba_shift, b, len, tag);
			else
				rc = vfpoll_qpair_write(q->qp, vf->nsid, off >> vf->lba_shift, b, len, tag);
			if (rc < 0 && io->bounce) {
				vfpoll_buf_free(io->bounce);
				io->bounce = NULL;
			}
		}
		break;
	}
	case DDIR_TRIM: {
		vfpoll_range r = { off >> vf->lba_shift, (uint32_t)(len >> vf->lba_shift) };
		if ((len >> vf->lba_shift) > UINT32_MAX) {
			io_u->error = EINVAL;
			return FIO_Q_COMPLETED;
		}
		rc = vfpoll_qpair_deallocate(q->qp, vf->nsid, &r, 1, tag);
		break;
	}
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		rc = vfpoll_qpair_flush(q->qp, vf->nsid, tag);
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	if (rc == -EAGAIN || rc == -ENOBUFS)
		return FIO_Q_BUSY;
	if (rc < 0) {
		log_err(ENGINE ": %s: %s\n", io_u->file->file_name, vfpoll_last_error());
		io_u->error = -rc;
		return FIO_Q_COMPLETED;
	}
	q->pending++;
	q->inflight++;
	return FIO_Q_QUEUED;
}

/*
 * A doorbell here only for a queue pair whose controller has nothing else to do: otherwise the
 * next getevents() polls, and a poll rings the doorbell once for everything queued since (SPDK's
 * fio plugin defers the same way: delay_cmd_submit). fio reaps before it waits for anything else
 * (io_u_quiesce() before think time, under rate limits, at the end of a job), so a queued command
 * never waits on fio. fio commits after every io_u by default. At queue depth 1 every commit
 * rings (the controller starts while fio does its bookkeeping); at depth 32 the first commit
 * after a burst of completions rings and the rest of the burst goes with the next poll. Up to
 * f8d5b17 the engine rang whenever fewer than 8 other commands kept the controller busy: a ring
 * per commit for the first 8 after each burst, a third of fio's time at depth 32 on the test bed
 * (in-guest perf profile, BENCHMARKS.md).
 */
static int vfp_commit(struct thread_data *td)
{
	struct vfp_td *s = td->io_ops_data;
	for (unsigned int i = 0; i < s->nqps; i++) {
		struct vfp_qp *q = &s->qps[i];
		if (!q->pending || q->inflight > q->pending)
			continue;
		q->pending = 0;
		int rc = vfpoll_qpair_commit(q->qp);
		if (rc < 0) {
			vfp_err("vfpoll_qpair_commit", rc);
			return rc;
		}
	}
	return 0;
}

static void complete(struct vfp_td *s, const vfpoll_completion *c, unsigned int *got)
{
	struct vfp_io *io = &s->ios[c->tag];
	struct io_u *io_u = io->io_u;
	if (c->status == 0) {
		io_u->error = 0;
		if (io->bounce && io_u->ddir == DDIR_READ) {
			int rc = vfpoll_buf_read(io->bounce, 0, io_u->xfer_buf, io_u->xfer_buflen);
			if (rc < 0)
				io_u->error = -rc;
		}
	} else {
		io_u->error = -c->status;
		io->nvme_status = c->nvme_status;
		if (c->buffer_lost && !io->bounce && ddir_rw(io_u->ddir) && s->zero_copy) {
			/* Retired: the device might still write to it; I/O on it fails from now on. */
			size_t i = (size_t)((char *)io_u->xfer_buf - s->base) / s->buf_size;
			vfpoll_buf_free(s->bufs[i]);
			s->bufs[i] = NULL;
		}
	}
	if (io->bounce) {
		vfpoll_buf_free(io->bounce);
		io->bounce = NULL;
	}
	s->events[(*got)++] = io_u;
}

static bool past(const struct timespec *start, const struct timespec *t)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	int64_t ns = (int64_t)(now.tv_sec - start->tv_sec) * 1000000000 + (now.tv_nsec - start->tv_nsec);
	return ns >= (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* Hands stashed completions to fio, up to `max` events in all. */
static void unstash(struct vfp_td *s, unsigned int max, unsigned int *got)
{
	while (s->stashed && *got < max) {
		complete(s, &s->comps[s->stash_at++], got);
		s->stashed--;
	}
}

/*
 * Polls (never sleeps) until `min` completions, or `t` has passed. A poll takes every
 * completion the queue pair has (up to the depth); those past `max` wait in the stash for the
 * next calls, which poll again only once it is empty.
 */
static int vfp_getevents(struct thread_data *td, unsigned int min, unsigned int max, const struct timespec *t)
{
	struct vfp_td *s = td->io_ops_data;
	struct timespec start;
	unsigned int got = 0, rounds = 0;
	if (max > s->nios)
		max = s->nios;
	unstash(s, max, &got);
	if (got >= min || got == max)
		return (int)got;
	for (;;) {
		for (unsigned int k = 0; k < s->nqps && got < max; k++) {
			struct vfp_qp *q = &s->qps[(s->rr + k) % s->nqps];
			int n = vfpoll_qpair_poll(q->qp, s->comps, s->nios);
			if (n < 0) {
				vfp_err("vfpoll_qpair_poll", n);
				return n;
			}
			q->pending = 0;
			q->inflight -= (unsigned int)n;
			s->stash_at = 0;
			s->stashed = (unsigned int)n;
			unstash(s, max, &got);
		}
		s->rr++;
		if (got >= min || got == max)
			break;
		/*
		 * The clock only once polling has gone on for a while: fio passes a timeout with
		 * most calls, and a clock read can cost more than the I/O (the test bed's guest reads
		 * the HPET: one read per call cut the IOPS at queue depth 32 to a sixth).
		 */
		if (t && ++rounds % 64 == 0) {
			if (rounds == 64)
				clock_gettime(CLOCK_MONOTONIC, &start);
			else if (past(&start, t))
				break;
		}
	}
	return (int)got;
}

static struct io_u *vfp_event(struct thread_data *td, int ev)
{
	struct vfp_td *s = td->io_ops_data;
	return s->events[ev];
}

/* fio prints this beside a failed I/O's error. */
static char *vfp_errdetails(struct io_u *io_u)
{
	struct vfp_file *vf = io_u->file ? FILE_ENG_DATA(io_u->file) : NULL;
	if (!vf || io_u->index >= vf->s->nios)
		return NULL;
	uint16_t st = vf->s->ios[io_u->index].nvme_status;
	if (!st)
		return NULL;
	char *msg = malloc(96);
	if (msg)
		snprintf(msg, 96, "NVMe status %#x: SCT %u, SC %#x%s", st, (st >> 9) & 7, (st >> 1) & 0xff,
			 st & 0x8000 ? ", DNR" : "");
	return msg;
}

static int vfp_open_file(struct thread_data *td, struct fio_file *f)
{
	(void)td;
	return FILE_ENG_DATA(f) ? 0 : 1;
}

static int vfp_close_file(struct thread_data *td, struct fio_file *f)
{
	(void)td;
	(void)f;
	return 0;
}

static void vfp_cleanup(struct thread_data *td)
{
	struct vfp_td *s = td->io_ops_data;
	if (!s)
		return;
	if (s->ios)
		drain(s);
	struct vfp_options *o = td->eo;
	for (unsigned int i = 0; i < s->nqps && o && o->stats; i++) {
		vfpoll_qpair_stats st;
		int rc = vfpoll_qpair_get_stats(s->qps[i].qp, &st);
		if (rc < 0) {
			vfp_err("vfpoll_qpair_get_stats", rc);
			continue;
		}
		double per = st.requests ? 1.0 / (double)st.requests : 0.0;
		uint64_t found = st.polls - st.empty_polls;
		log_info(ENGINE ": job %s, %s: %" PRIu64 " requests, %" PRIu64 " errors; SQ doorbells %" PRIu64
			 " (%.3f per request), CQ doorbells %" PRIu64 " (%.3f), shadow-only updates %" PRIu64
			 "; polls %" PRIu64 " (%.1f%% empty, %.2f completions per non-empty poll)\n",
			 td->o.name, s->qps[i].c->pci, st.requests, st.errors, st.sq_doorbells,
			 (double)st.sq_doorbells * per, st.cq_doorbells, (double)st.cq_doorbells * per,
			 st.shadow_only, st.polls, st.polls ? 100.0 * (double)st.empty_polls / (double)st.polls : 0.0,
			 found ? (double)st.completions / (double)found : 0.0);
	}
	for (unsigned int i = 0; i < s->nqps; i++) {
		int rc = vfpoll_qpair_destroy(s->qps[i].qp);
		if (rc < 0)
			vfp_err("vfpoll_qpair_destroy", rc);
	}
	for (unsigned int i = 0; i < s->nfiles; i++) {
		put_ctrl(s->files[i]->c);
		free(s->files[i]);
	}
	/* fio's files outlive nothing of ours: they are freed before cleanup() runs. */
	free(s->files);
	free(s->qps);
	free(s->ios);
	free(s->events);
	free(s->comps);
	free(s);
	td->io_ops_data = NULL;
}

struct ioengine_ops ioengine = {
	.name = ENGINE,
	.version = FIO_IOOPS_VERSION,
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_DISKLESSIO | FIO_MEMALIGN | FIO_NO_OFFLOAD,
	.setup = vfp_setup,
	.init = vfp_init,
	.queue = vfp_queue,
	.commit = vfp_commit,
	.getevents = vfp_getevents,
	.event = vfp_event,
	.errdetails = vfp_errdetails,
	.cleanup = vfp_cleanup,
	.open_file = vfp_open_file,
	.close_file = vfp_close_file,
	.iomem_alloc = vfp_iomem_alloc,
	.iomem_free = vfp_iomem_free,
	.io_u_init = vfp_io_u_init,
	.option_struct_size = sizeof(struct vfp_options),
	.options = options,
};
