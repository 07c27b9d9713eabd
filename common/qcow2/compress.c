/* SPDX-License-Identifier: BSD-3-Clause */
/* Compressed clusters: deflate (raw, 4 KiB window, as QEMU writes it)
 * and zstd.  A compressed cluster always decompresses to exactly one
 * cluster; anything else is a bad descriptor or bad data.  Compressing
 * a cluster for a write uses QEMU's settings, so that images come out
 * the size qemu-img convert -c makes them.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"
#include "threadobj.h"

/* What each thread keeps from one compressed cluster to the next, so
 * that a sequential read of a compressed image allocates nothing per
 * cluster: the decompression contexts (reset, not remade), the input
 * buffer, and a cluster buffer for reads of part of a cluster.  Freed
 * when the thread ends.
 */
struct compress_tls {
  z_stream z, zc;
  bool z_ready, zc_ready;
  ZSTD_DCtx *zstd;
  ZSTD_CCtx *zstd_c;
  uint8_t *in, *cluster, *out;
  size_t in_cap, cluster_cap, out_cap;
};

static pthread_key_t compress_key;
static pthread_once_t compress_once = PTHREAD_ONCE_INIT;
static bool compress_key_ok;

static void
compress_tls_free (void *p)
{
  struct compress_tls *t = p;

  if (t->z_ready)
    inflateEnd (&t->z);
  if (t->zc_ready)
    deflateEnd (&t->zc);
  ZSTD_freeDCtx (t->zstd);
  ZSTD_freeCCtx (t->zstd_c);
  free (t->in);
  free (t->cluster);
  free (t->out);
  free (t);
}

static void
compress_key_make (void)
{
  compress_key_ok = pthread_key_create (&compress_key, compress_tls_free) == 0;
}

static struct compress_tls *
compress_tls_get (void)
{
  pthread_once (&compress_once, compress_key_make);
  if (!compress_key_ok)
    return NULL;
  return thread_object (compress_key, sizeof (struct compress_tls), NULL);
}

/* Returns *buf, grown to at least n bytes (its capacity in *cap). */
static uint8_t *
compress_buffer (uint8_t **buf, size_t *cap, size_t n)
{
  if (*cap < n) {
    uint8_t *p = realloc (*buf, n);
    if (!p)
      return NULL;
    *buf = p;
    *cap = n;
  }
  return *buf;
}

static int
compress_inflate (struct compress_tls *t, uint8_t *out, size_t out_len,
                  uint8_t *in, size_t in_len)
{
  z_stream *strm = &t->z;
  int r;

  if (!t->z_ready) {
    memset (strm, 0, sizeof *strm);
    if (inflateInit2 (strm, -12) != Z_OK)
      return -ENOMEM;
    t->z_ready = true;
  }
  else if (inflateReset (strm) != Z_OK)
    return -EIO;
  strm->next_in = in;
  strm->avail_in = in_len;
  strm->next_out = out;
  strm->avail_out = out_len;
  r = inflate (strm, Z_FINISH);
  /* The descriptor's length is rounded up to sectors, so input may be
   * left over; the output must be exactly one cluster.
   */
  if ((r == Z_STREAM_END || r == Z_BUF_ERROR) && strm->avail_out == 0)
    return 0;
  return -EIO;
}

static int
compress_unzstd (struct compress_tls *t, uint8_t *out, size_t out_len,
                 const uint8_t *in, size_t in_len)
{
  ZSTD_inBuffer input = { in, in_len, 0 };
  ZSTD_outBuffer output = { out, out_len, 0 };

  if (!t->zstd && !(t->zstd = ZSTD_createDCtx ()))
    return -ENOMEM;
  if (ZSTD_isError (ZSTD_DCtx_reset (t->zstd, ZSTD_reset_session_only)))
    return -EIO;
  /* Stream, as QEMU does: the frame may be followed by padding. */
  while (output.pos < output.size) {
    size_t ret = ZSTD_decompressStream (t->zstd, &output, &input);
    if (ZSTD_isError (ret))
      return -EIO;
    if (output.pos < output.size && input.pos == input.size)
      return -EIO;              /* ran out of input before one cluster */
  }
  return 0;
}

int
compress_read (struct qcow2_image *img, uint64_t comp_offset,
               uint64_t comp_size, uint64_t in_cluster, uint64_t len,
               uint8_t *buf)
{
  uint64_t file_size = image_file_size (img), cs = img->geo.cluster_size;
  struct compress_tls *t = compress_tls_get ();
  uint8_t *in, *out;
  int r;

  assert (len > 0 && in_cluster + len <= cs);
  if (!t)
    return -ENOMEM;
  /* Bad compressed data fails the read, as in QEMU, but does not mark
   * the image corrupt: a file cut short is not a broken structure, and
   * a read writes nothing.
   */
  if (comp_offset >= file_size) {
    log_error (img, "corrupt image: compressed cluster at host offset %#"
               PRIx64 " lies beyond the end of the file (the file ends at %#"
               PRIx64 ")", comp_offset, file_size);
    return -EIO;
  }
  /* The last compressed cluster may end before its last sector. */
  comp_size = MIN (comp_size, file_size - comp_offset);

  /* A whole cluster goes straight to the caller's buffer. */
  out = in_cluster == 0 && len == cs ? buf
    : compress_buffer (&t->cluster, &t->cluster_cap, cs);
  in = compress_buffer (&t->in, &t->in_cap, comp_size);
  if (!out || !in)
    return -ENOMEM;
  r = img->io->ops->pread (img->io, in, comp_size, comp_offset);
  if (r < 0) {
    log_error (img, "reading compressed cluster at %#" PRIx64 ": %s",
               comp_offset, errstr (-r));
    return io_errno (r);
  }
  if (img->h.compression_type == QCOW2_COMPRESSION_ZSTD)
    r = compress_unzstd (t, out, cs, in, comp_size);
  else
    r = compress_inflate (t, out, cs, in, comp_size);
  if (r == -EIO)
    log_error (img, "corrupt image: compressed cluster at host offset %#"
               PRIx64 " (%" PRIu64 " bytes, %s) does not decompress to one "
               "cluster", comp_offset, comp_size,
               img->h.compression_type == QCOW2_COMPRESSION_ZSTD
               ? "zstd" : "deflate");
  else if (r == 0 && out != buf)
    memcpy (buf, out + in_cluster, len);
  return r;
}

/* Deflate as QEMU does: level 6, raw, a 4 KiB window. */
static ssize_t
compress_deflate (struct compress_tls *t, uint8_t *out, size_t cap,
                  const uint8_t *in, size_t len)
{
  z_stream *strm = &t->zc;
  int r;

  if (!t->zc_ready) {
    memset (strm, 0, sizeof *strm);
    if (deflateInit2 (strm, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -12, 9,
                      Z_DEFAULT_STRATEGY) != Z_OK)
      return -ENOMEM;
    t->zc_ready = true;
  }
  else if (deflateReset (strm) != Z_OK)
    return -EIO;
  strm->next_in = (uint8_t *) in;
  strm->avail_in = len;
  strm->next_out = out;
  strm->avail_out = cap;
  r = deflate (strm, Z_FINISH);
  if (r == Z_STREAM_END)
    return cap - strm->avail_out;
  return r == Z_OK || r == Z_BUF_ERROR ? -ENOSPC : -EIO;
}

/* zstd at its default level, one frame, as QEMU does. */
static ssize_t
compress_zstd (struct compress_tls *t, uint8_t *out, size_t cap,
               const uint8_t *in, size_t len)
{
  ZSTD_inBuffer input = { in, len, 0 };
  ZSTD_outBuffer output = { out, cap, 0 };
  size_t r;

  if (!t->zstd_c && !(t->zstd_c = ZSTD_createCCtx ()))
    return -ENOMEM;
  if (ZSTD_isError (ZSTD_CCtx_reset (t->zstd_c, ZSTD_reset_session_only)))
    return -EIO;
  r = ZSTD_compressStream2 (t->zstd_c, &output, &input, ZSTD_e_end);
  if (ZSTD_isError (r))
    return ZSTD_getErrorCode (r) == ZSTD_error_dstSize_tooSmall
      ? -ENOSPC : -EIO;
  return r == 0 ? (ssize_t) output.pos : -ENOSPC;
}

ssize_t
compress_cluster (const struct qcow2_image *img, const uint8_t *cluster,
                  const uint8_t **out)
{
  uint64_t cs = img->geo.cluster_size;
  struct compress_tls *t = compress_tls_get ();
  uint8_t *buf;

  if (!t || !(buf = compress_buffer (&t->out, &t->out_cap, cs)))
    return -ENOMEM;
  *out = buf;
  /* Less than a cluster, or it is not worth it. */
  if (img->h.compression_type == QCOW2_COMPRESSION_ZSTD)
    return compress_zstd (t, buf, cs - 1, cluster, cs);
  return compress_deflate (t, buf, cs - 1, cluster, cs);
}
