/* Compressed clusters: deflate (raw, 4 KiB window, as QEMU writes it)
 * and zstd.  A compressed cluster always decompresses to exactly one
 * cluster; anything else is a bad descriptor or bad data.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "checked.h"
#include "errstr.h"
#include "internal.h"

static int
compress_inflate (uint8_t *out, size_t out_len, uint8_t *in, size_t in_len)
{
  z_stream strm;
  int r;

  memset (&strm, 0, sizeof strm);
  if (inflateInit2 (&strm, -12) != Z_OK)
    return -ENOMEM;
  strm.next_in = in;
  strm.avail_in = in_len;
  strm.next_out = out;
  strm.avail_out = out_len;
  r = inflate (&strm, Z_FINISH);
  inflateEnd (&strm);
  /* The descriptor's length is rounded up to sectors, so input may be
   * left over; the output must be exactly one cluster.
   */
  if ((r == Z_STREAM_END || r == Z_BUF_ERROR) && strm.avail_out == 0)
    return 0;
  return -EIO;
}

static int
compress_unzstd (uint8_t *out, size_t out_len, const uint8_t *in,
                 size_t in_len)
{
  ZSTD_DCtx *dctx = ZSTD_createDCtx ();
  ZSTD_inBuffer input = { in, in_len, 0 };
  ZSTD_outBuffer output = { out, out_len, 0 };
  int r = 0;

  if (!dctx)
    return -ENOMEM;
  /* Stream, as QEMU does: the frame may be followed by padding. */
  while (output.pos < output.size) {
    size_t ret = ZSTD_decompressStream (dctx, &output, &input);
    if (ZSTD_isError (ret)) {
      r = -EIO;
      break;
    }
    if (output.pos < output.size && input.pos == input.size) {
      r = -EIO;                 /* ran out of input before one cluster */
      break;
    }
  }
  ZSTD_freeDCtx (dctx);
  return r;
}

int
compress_read_cluster (struct qcow2_image *img, uint64_t comp_offset,
                       uint64_t comp_size, uint8_t *out)
{
  uint64_t file_size = image_file_size (img);
  uint8_t *in;
  int r;

  if (comp_offset >= file_size) {
    qcow2_err (img, "corrupt image: compressed cluster at host offset %#"
               PRIx64 " lies beyond the end of the file (%" PRIu64 " bytes)",
               comp_offset, file_size);
    return -EIO;
  }
  /* The last compressed cluster may end before its last sector. */
  comp_size = MIN (comp_size, file_size - comp_offset);

  in = malloc (comp_size);
  if (!in)
    return -ENOMEM;
  r = img->io->ops->pread (img->io, in, comp_size, comp_offset);
  if (r < 0) {
    qcow2_err (img, "reading compressed cluster at %#" PRIx64 ": %s",
               comp_offset, errstr (-r));
    r = io_errno (r);
    goto out;
  }
  if (img->h.compression_type == QCOW2_COMPRESSION_ZSTD)
    r = compress_unzstd (out, img->cluster_size, in, comp_size);
  else
    r = compress_inflate (out, img->cluster_size, in, comp_size);
  if (r == -EIO)
    qcow2_err (img, "corrupt image: compressed cluster at host offset %#"
               PRIx64 " (%" PRIu64 " bytes, %s) does not decompress to one "
               "cluster", comp_offset, comp_size,
               img->h.compression_type == QCOW2_COMPRESSION_ZSTD
               ? "zstd" : "deflate");
 out:
  free (in);
  return r;
}
