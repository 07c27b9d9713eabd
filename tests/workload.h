/* SPDX-License-Identifier: BSD-3-Clause */
/* Random write workloads on the engine for the crash and fault tests:
 * image configurations, a seeded generator of requests, a runner that
 * sends them to an image over a crashio, and a model of what the guest
 * must read back: bytes no request touched since they were last made
 * durable (by a flush, a FUA request or a clean close) hold exactly what
 * was written; other bytes hold a value some request since then wrote.
 */
#ifndef QCOW2_WORKLOAD_H
#define QCOW2_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcow2.h"
#include "crashio.h"
#include "memio.h"

/* A small deterministic generator (splitmix64). */
struct wl_rng {
  uint64_t s;
};
extern uint64_t wl_rand (struct wl_rng *r);
extern uint64_t wl_below (struct wl_rng *r, uint64_t n);    /* [0, n) */

enum wl_backing { WL_NO_BACKING, WL_RAW_BACKING, WL_QCOW2_BACKING };
enum wl_gen { WL_GEN_RANDOM, WL_GEN_FILL };

struct wl_config {
  const char *name;
  unsigned cluster_bits;
  uint64_t size;
  bool v2, lazy, extl2;
  enum wl_backing backing;
  /* Built by hand (imgbuild) with data, zero and compressed clusters
   * and a snapshot sharing L2 tables and data clusters, rather than
   * created empty by the engine.
   */
  bool built;
  bool compressed, snapshot;
  /* Built only: persistent bitmaps, two enabled (fine and coarse) and
   * one disabled, each with some bits set.
   */
  bool bitmaps;
  /* Guest data in an external data file (raw: equal to the guest),
   * recorded as a second file: a crash keeps any subset of the writes
   * to either since its last flush.
   */
  bool data_file, data_file_raw;
  unsigned refcount_order;      /* built only: 0 = 16 bits */
  uint64_t l2_cache_size;       /* small: dirty slices evicted mid-request */
  uint64_t l2_slice_size;
  enum wl_gen gen;              /* random requests, or filling the disk */
  /* Opened with copy_on_read, and reads and fills (qcow2_fill) among
   * the requests: clusters filled from the backing file as writes,
   * zeroes and trims come and go.
   */
  bool copy_on_read;
  /* The image's storage grows by writes, as O_DIRECT storage does
   * (qcow2_io.grows_by_writes): no extension ahead of allocations.
   */
  bool grows_by_writes;
  unsigned ops;                 /* requests per workload */
};

extern const struct wl_config wl_configs[];
extern const size_t wl_nr_configs;
extern const struct wl_config *wl_config_find (const char *name);

enum wl_kind {
  WL_WRITE, WL_ZERO, WL_TRIM, WL_FLUSH,
  WL_REOPEN,                    /* clean close, open again */
  WL_REPAIR,                    /* qcow2_check fixing leaks */
  WL_CHECK,                     /* qcow2_check: nothing wrong in memory */
  WL_READ,                      /* copy_on_read: read, as the model says */
  WL_FILL,                      /* qcow2_fill */
};

struct wl_op {
  enum wl_kind kind;
  uint64_t offset, len;
  uint32_t seed;                /* WL_WRITE: data pattern */
  bool fua, may_trim;
};

/* The requests of one workload, from seed. */
extern void wl_generate (const struct wl_config *cfg, uint64_t seed,
                         struct wl_op **ops, size_t *n);
/* One request as a line of text, and back (0, or -1 if malformed). */
extern void wl_format_op (const struct wl_op *op, char *buf, size_t len);
extern int wl_parse_op (const char *line, struct wl_op *op);

/* What the guest must read back. */
struct wl_model {
  uint64_t size, cluster_size;
  uint8_t *acked;               /* after the last completed request */
  uint8_t *durable;             /* as last made durable */
  uint8_t *dirty;               /* 1: touched since it was made durable */
  const uint8_t *trimmed;       /* what a trim leaves, or NULL: nothing */
  struct wl_op *since;          /* requests since the last flush */
  size_t nsince, capsince;
};

/* The initial image of a configuration, and the files it names. */
struct wl_setup {
  const struct wl_config *cfg;
  uint8_t *image;
  size_t len;
  struct memenv *me;            /* the backing file, if any */
  uint8_t *trimmed;             /* size bytes: what a trim leaves, or NULL */
  uint8_t *initial;             /* with bitmaps: the guest at the start */
};

/* The files of an image: the image and its external data file (NULL,
 * 0 without one).
 */
struct wl_files {
  const uint8_t *image;
  size_t len;
  const uint8_t *data;
  size_t dlen;
};
extern void wl_setup (const struct wl_config *cfg, uint64_t seed,
                      struct wl_setup *s);
extern void wl_setup_free (struct wl_setup *s);

/* The setup's initial files. */
extern struct wl_files wl_setup_files (const struct wl_setup *s);

/* Open a copy of the files as the configuration's image. */
extern struct qcow2_image *wl_open_copy (const struct wl_setup *s,
                                         struct wl_files files,
                                         bool readonly);

/* An image being worked on, over a crashio. */
struct wl_run {
  const struct wl_setup *setup;
  struct crashio *cio;
  struct crashio *dcio;         /* the external data file, or NULL */
  struct qcow2_env env;         /* opens dcio for the data file */
  struct qcow2_image *img;
  struct wl_model model;
  struct qcow2_check_result check;      /* of the last WL_CHECK/REPAIR */
};

/* Start from (copies of) files whose guest reads as initial. */
extern int wl_run_start (struct wl_run *run, const struct wl_setup *s,
                         struct wl_files files, const uint8_t *initial);
/* The files now (as reads see them), valid until the next write. */
extern struct wl_files wl_run_files (struct wl_run *run);
extern void wl_run_end (struct wl_run *run);

/* Send one request, keeping the model: 0 or -errno (-EUCLEAN when a
 * check or repair finds a corruption, -EILSEQ when a read returns
 * other bytes than the model).
 */
extern int wl_exec (struct wl_run *run, const struct wl_op *op);

/* Whether buf (the whole guest, as read from an image a crash left) is
 * one the model allows; if not, says where in why.
 */
extern bool wl_model_check (const struct wl_model *m, const uint8_t *buf,
                            char *why, size_t whylen);

/* The model's bytes [offset, offset+len) hold what the image read
 * after a request failed; false (with why) if some byte holds a value
 * that no request wrote there.
 */
extern bool wl_model_adopt (struct wl_model *m, const uint8_t *buf,
                            uint64_t offset, uint64_t len, char *why,
                            size_t whylen);

/* A buffer reused from one image to the next: large allocations are
 * slow under AddressSanitizer.
 */
struct wl_buf {
  uint8_t *p;
  size_t cap;
};
extern uint8_t *wl_buf_get (struct wl_buf *b, size_t len);

/* Read the whole guest of img into b (NULL on error, with errno). */
extern uint8_t *wl_read_all (struct qcow2_image *img, struct wl_buf *b);

#endif /* QCOW2_WORKLOAD_H */
