/* SPDX-License-Identifier: BSD-3-Clause */
/* The read-ahead of a backing layer on remote storage, and what it
 * keeps of what it fetched.
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "monotonic.h"

/* Read-ahead of a backing layer on remote storage (storage with
 * pread_many: each request costs a round trip).  A read of the layer
 * that starts where the last one ended reads READAHEAD_WINDOW more in
 * the same request, kept in a window that the next sequential reads
 * are copied from: a guest read sequentially costs one round trip a
 * window, not one a request.  It is by guest offset, so that it also
 * works for a qcow2 layer whose clusters lie anywhere in its file.
 * Backing layers are never written, so a window never goes stale.
 *
 * It starts with the second read of a sequential run (a lone read, such
 * as the first sector's, gets what it asked for), with as much again
 * as the read (READAHEAD_MIN at least), doubled by each further read of
 * the run up to READAHEAD_WINDOW, never more than the run has read so
 * far (two adjacent reads of 4 KiB, a file system's metadata, fetch
 * 8 KiB more, not 64: such runs mostly end there), and never more than
 * the link was measured to deliver in READAHEAD_MS: over a slow link a
 * small read does not wait for megabytes it did not ask for.
 *
 * A reader with several requests in flight (a guest's own read-ahead,
 * nbdcopy, qemu-img convert) is its own read-ahead: a read that comes
 * while another read of the layer is under way starts no window and
 * waits for no other request, but goes out at once with what it asked
 * for, all in flight together on the storage's connections.  Only a
 * read that falls in a window being filled waits for it (a reader
 * turning deep while a window fills; the window is as much again as
 * the read that started it, doubled per read of the run, so that read
 * waits for little more than its own data).  Two windows, so that one
 * stays readable while the other fills.
 *
 * Read-ahead pays for itself: over a real network every byte fetched
 * and not read costs, and a guest's boot (scattered small reads, files
 * read in short runs) ends most runs a window early, while a reader
 * without read-ahead (qemu's nbd driver) makes the layer send just
 * what it asks for.  The layer's excess, the bytes fetched of it less
 * the bytes read of it (the unread part of the windows, less the reads
 * that a window or a kept piece served without a fetch), is what
 * read-ahead may spend: a window never takes it past READAHEAD_WINDOW
 * while the reader is trusted, nor past 0 once it is not.  A reader is
 * trusted until a run of its reads ends with a window unread (a
 * reader that stops short: a boot); from then on only what reads of
 * kept pieces saved funds windows, and the layer sends that reader no
 * more than it asks for but the window of that run.  A run of more
 * than READAHEAD_STREAM bytes (a copy, a long file) trusts it again: a
 * stream loses at most a window at its end, an eighth of what it read.
 * And a window is capped by how the last ones fared: a window dropped
 * with more than half of it unread halves the cap (down to
 * READAHEAD_MIN), one read to its end doubles it, to twice that window
 * at least (up to READAHEAD_WINDOW); the cap never holds a window below
 * the size of the read that starts it.  A sequential reader reads
 * every window to its end: its windows grow much as they did without
 * the cap.
 *
 * What was fetched is kept a while (kept.c: the last KEPT_BYTES, or
 * qcow2_options.remote_keep, in at most KEPT_PIECES pieces, the least
 * recently read let go first): what reads asked for one at a time, and
 * the windows once dropped.  A read that falls in them (a guest reads
 * again what its own cache let go: metadata, a file opened twice during
 * a boot) costs no fetch, one that falls in them in part (a cluster
 * copied on write around blocks the guest read) fetches only the rest,
 * and what that saved funds the windows of a reader not trusted.  A
 * deep reader's reads are kept up to READAHEAD_KEEP_DEEP bytes each (a
 * guest with several reads in flight rereads its metadata too), and
 * larger ones unless each continues the ones before (out of order as
 * far as its reads in flight go): such a reader streams (nbdcopy,
 * qemu-img convert), copying each read would cost it, and it reads
 * none again; a second pass from the start streams too.
 * A window ends where a kept piece begins.
 */
#define READAHEAD_WINDOW (4u << 20)
#define READAHEAD_MIN (64u << 10)
#define READAHEAD_MS 200
#define READAHEAD_DEEP 8
#define READAHEAD_STREAM (8 * READAHEAD_WINDOW)
#define READAHEAD_KEEP_DEEP (128u << 10)

enum window_state { WINDOW_EMPTY, WINDOW_FILLING, WINDOW_FULL };

struct readahead {
  struct qcow2_image *layer;    /* the layer read ahead of */
  readahead_fetch fetch;        /* reads the layer */
  struct lock lock;             /* guards all below */
  pthread_cond_t filled;        /* a window stopped filling */
  uint64_t next;                /* where the last read ended */
  unsigned run;                 /* reads that continued the one before */
  uint64_t run_bytes;           /* bytes read in that run, from its start */
  uint64_t last_count;          /* bytes of the last read */
  unsigned busy;                /* reads of the layer under way */
  /* Reads lately that came while others were under way, up to
   * READAHEAD_DEEP, less one per read that came alone: windows are for
   * a reader at 0 only.
   */
  unsigned deep;
  uint64_t rate;                /* bytes a second the layer gave (0: ?) */
  uint64_t asked;               /* bytes read of the layer */
  uint64_t fetched;             /* bytes fetched of it, windows in flight too */
  bool trusted;                 /* windows may take the excess past 0 */
  uint64_t cap;                 /* the largest window now */
  struct {
    enum window_state state;
    uint64_t start, len;
    uint64_t served;            /* bytes read from it (some twice) */
    uint8_t *buf;
  } w[2];
  struct kept_set kept;
};

struct readahead *
readahead_new (struct qcow2_image *layer, readahead_fetch fetch,
               uint64_t keep)
{
  struct readahead *ra = calloc (1, sizeof *ra);

  if (!ra)
    return NULL;
  ra->layer = layer;
  ra->fetch = fetch;
  lock_init (&ra->lock);
  lock_cond_init (&ra->filled);
  ra->next = UINT64_MAX;        /* the first read starts no run */
  ra->cap = READAHEAD_MIN;
  ra->trusted = true;
  ra->kept.limit = keep ? keep : KEPT_BYTES;
  return ra;
}

void
readahead_free (struct readahead *ra)
{
  if (!ra)
    return;
  free (ra->w[0].buf);
  free (ra->w[1].buf);
  kept_free (&ra->kept);
  pthread_cond_destroy (&ra->filled);
  lock_destroy (&ra->lock);
  free (ra);
}

/* Returns the window holding [offset, end), or -1. */
static int
readahead_find (struct readahead *ra, uint64_t offset, uint64_t end)
  TSA_REQUIRES (ra->lock)
{
  for (int i = 0; i < 2; i++)
    if (ra->w[i].state != WINDOW_EMPTY && offset >= ra->w[i].start &&
        end <= ra->w[i].start + ra->w[i].len)
      return i;
  return -1;
}

/* [offset, end) of the full window i into buf, and counted. */
static void
readahead_take (struct readahead *ra, int i, uint8_t *buf, uint64_t offset,
                uint64_t end)
  TSA_REQUIRES (ra->lock)
{
  bool was_short = ra->w[i].served < ra->w[i].len;

  memcpy (buf, ra->w[i].buf + (offset - ra->w[i].start), end - offset);
  ra->w[i].served += end - offset;
  ra->asked += end - offset;
  if (was_short && ra->w[i].served >= ra->w[i].len)
    ra->cap = MIN (MAX (ra->cap, ra->w[i].len) * 2, READAHEAD_WINDOW);
}

/* [offset, end) was read from a window: the run it continues, or
 * starts.
 */
static void
readahead_follow (struct readahead *ra, uint64_t offset, uint64_t end)
  TSA_REQUIRES (ra->lock)
{
  ra->run_bytes = offset == ra->next ? ra->run_bytes + (end - offset)
                  : end - offset;
  ra->next = MAX (ra->next, end);
}

/* A copy of buf, len bytes of the layer from start, kept (if memory
 * allows: keeping only saves fetches).
 */
static void
readahead_keep_copy (struct readahead *ra, const uint8_t *buf, uint64_t start,
                     uint64_t len)
  TSA_REQUIRES (ra->lock)
{
  uint8_t *copy = malloc (len);

  if (copy) {
    memcpy (copy, buf, len);
    kept_add (&ra->kept, copy, start, len);
  }
}

/* [offset, end) copied from the kept pieces, if they hold all of it. */
static bool
readahead_take_kept (struct readahead *ra, uint8_t *buf, uint64_t offset,
                     uint64_t end)
  TSA_REQUIRES (ra->lock)
{
  uint64_t gap_start, gap_end;

  if (kept_copy (&ra->kept, buf, offset, end, &gap_start, &gap_end) <
      end - offset)
    return false;
  ra->asked += end - offset;
  return true;
}

/* Window i dropped: the cap it leaves. */
static void
readahead_drop (struct readahead *ra, int i)
  TSA_REQUIRES (ra->lock)
{
  if (ra->w[i].state == WINDOW_FULL) {
    if (ra->w[i].served < ra->w[i].len / 2)
      ra->cap = MAX (ra->cap / 2, READAHEAD_MIN);
    kept_add (&ra->kept, ra->w[i].buf, ra->w[i].start, ra->w[i].len);
  }
  else
    free (ra->w[i].buf);
  ra->w[i].buf = NULL;
  ra->w[i].state = WINDOW_EMPTY;
}

/* Returns true if a full window holds bytes not read yet. */
static bool
readahead_unread (const struct readahead *ra)
  TSA_REQUIRES (ra->lock)
{
  for (int i = 0; i < 2; i++)
    if (ra->w[i].state == WINDOW_FULL && ra->w[i].served < ra->w[i].len)
      return true;
  return false;
}

/* Copies [offset, offset+count) from a window full of it or a kept
 * piece, if one is.  Returns true if it was.
 */
bool
readahead_copy (struct readahead *ra, uint8_t *buf, uint64_t count,
                uint64_t offset)
  TSA_EXCLUDES (ra->lock)
{
  bool found;
  int i;

  lock_acquire (&ra->lock);
  i = readahead_find (ra, offset, offset + count);
  if (i >= 0 && ra->w[i].state == WINDOW_FULL) {
    ra->last_count = count;
    readahead_take (ra, i, buf, offset, offset + count);
    if (offset == ra->next)
      ra->run++;
    readahead_follow (ra, offset, offset + count);
    found = true;
  }
  else
    found = readahead_take_kept (ra, buf, offset, offset + count);
  lock_release (&ra->lock);
  return found;
}

/* Reads up to end, count bytes in all, were made without the
 * read-ahead.
 */
void
readahead_note (struct readahead *ra, uint64_t end, uint64_t count)
  TSA_EXCLUDES (ra->lock)
{
  lock_acquire (&ra->lock);
  ra->next = end;
  ra->asked += count;
  ra->fetched += count;
  lock_release (&ra->lock);
}

static uint64_t
readahead_now_us (void)
{
  return monotonic_ns () / 1000;
}

/* How much to read after a read of count bytes (counted in ra->asked,
 * not yet in ra->fetched).
 */
static uint64_t
readahead_extra (const struct readahead *ra, uint64_t count)
  TSA_REQUIRES (ra->lock)
{
  int64_t room = (ra->trusted ? (int64_t) READAHEAD_WINDOW : 0) -
                 ((int64_t) (ra->fetched + count) - (int64_t) ra->asked);
  uint64_t w;

  if (ra->run == 0 || room <= 0)
    return 0;
  w = MIN (count, READAHEAD_WINDOW);
  w = MAX (w, READAHEAD_MIN) << MIN (ra->run - 1, 8u);
  w = MIN (w, MIN (MAX (ra->cap, count), READAHEAD_WINDOW));
  w = MIN (w, ra->run_bytes);
  if (ra->rate)
    w = MIN (w, ra->rate / (1000 / READAHEAD_MS));
  w = MIN (w, (uint64_t) room);
  /* Ending where a read of the run will: one that straddled the end
   * would fetch the part it shares with the window again.
   */
  return w - w % (count <= w ? count : READAHEAD_MIN);
}

/* Read len bytes at offset of the layer, and learn the link's rate
 * from it: what it delivers (latency included) averaged with what it
 * did.
 */
static int
readahead_timed (struct readahead *ra, uint8_t *buf, uint64_t len,
                 uint64_t offset)
  TSA_EXCLUDES (ra->lock)
{
  uint64_t t = readahead_now_us (), rate;
  int r = ra->fetch (ra->layer, buf, len, offset);

  t = readahead_now_us () - t;
  if (r == 0) {
    rate = len * 1000000 / MAX (t, 1);
    lock_acquire (&ra->lock);
    ra->rate = ra->rate ? ra->rate / 2 + rate / 2 : rate;
    lock_release (&ra->lock);
  }
  return r;
}

/* Read [offset, offset+count) of the layer directly (a read that
 * starts no window), counted in ra->busy, letting ra->lock go
 * meanwhile.
 */
static int
readahead_direct (struct readahead *ra, uint8_t *buf, uint64_t count,
                  uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  int r;

  ra->busy++;
  ra->fetched += count;
  lock_release (&ra->lock);
  r = readahead_timed (ra, buf, count, offset);
  lock_acquire (&ra->lock);
  assert (ra->busy > 0);
  ra->busy--;
  return r;
}

/* A read that starts in a window being filled waits for it, though it
 * goes past it: fetching at once would fetch what the window holds
 * again.
 */
static void
readahead_wait_filling (struct readahead *ra, uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  int i = readahead_find (ra, offset, offset + 1);

  if (i < 0 || ra->w[i].state != WINDOW_FILLING)
    return;
  ra->deep = MIN (ra->deep + 1, READAHEAD_DEEP);
  while ((i = readahead_find (ra, offset, offset + 1)) >= 0 &&
         ra->w[i].state == WINDOW_FILLING)
    lock_wait (&ra->lock, &ra->filled);
}

/* What full windows hold of the read at *offset: all of it (returns
 * true), or the head of a read that starts in a window and goes past it
 * (a run whose reads changed size), *buf, *count and *offset moved past
 * it, so that only the rest, which continues the run, is fetched.
 */
static bool
readahead_from_windows (struct readahead *ra, uint8_t **buf, uint64_t *count,
                        uint64_t *offset)
  TSA_REQUIRES (ra->lock)
{
  uint64_t end = *offset + *count, head;
  int i;

  if ((i = readahead_find (ra, *offset, end)) >= 0) {
    readahead_take (ra, i, *buf, *offset, end);
    readahead_follow (ra, *offset, end);
    return true;
  }
  if ((i = readahead_find (ra, *offset, *offset + 1)) >= 0 &&
      ra->w[i].state == WINDOW_FULL) {
    head = ra->w[i].start + ra->w[i].len - *offset;
    readahead_take (ra, i, *buf, *offset, *offset + head);
    readahead_follow (ra, *offset, *offset + head);
    *buf += head;
    *offset += head;
    *count -= head;
  }
  return false;
}

/* What kept pieces hold costs no fetch: a read they hold in part (a
 * cluster copied on write around blocks the guest read) fetches only
 * the span they do not (the read is kept whole, in place of the
 * pieces), and continues no run.  Returns true if they held any of
 * [offset, offset+count), the result in *r.
 */
static bool
readahead_from_kept (struct readahead *ra, uint8_t *buf, uint64_t count,
                     uint64_t offset, int *r)
  TSA_REQUIRES (ra->lock)
{
  uint64_t gap_start, gap_end, covered;

  covered = kept_copy (&ra->kept, buf, offset, offset + count, &gap_start,
                       &gap_end);
  if (covered == 0)
    return false;
  *r = 0;
  if (covered < count) {
    *r = readahead_direct (ra, buf + (gap_start - offset),
                           gap_end - gap_start, gap_start);
    if (*r == 0)
      readahead_keep_copy (ra, buf, offset, count);
  }
  ra->next = MAX (ra->next, offset + count);
  return true;
}

/* Returns true if a deep reader's read of count bytes at offset
 * continues its stream: it starts where its reads so far end, or as
 * near as the reads in flight with it may have been served out of
 * order (nbdkit's threads take a connection's requests in turn, and
 * one may overtake another).  A read far from it, behind as a second
 * pass from the start is, starts another.
 */
static bool
readahead_streams (const struct readahead *ra, uint64_t count,
                   uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  uint64_t span = (ra->busy + UINT64_C (1)) * count;

  return ra->next != UINT64_MAX && offset <= ra->next + span &&
         offset + span >= ra->next;
}

/* A deep reader (a read while others are under way): what it asks for
 * now, kept if small or if it does not stream; its run starts again
 * once it has read one request at a time for a while.
 */
static int
readahead_deep_read (struct readahead *ra, uint8_t *buf, uint64_t count,
                     uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  bool streams = readahead_streams (ra, count, offset);
  int r;

  ra->deep = ra->busy > 0 ? MIN (ra->deep + 1, READAHEAD_DEEP)
             : ra->deep - 1;
  ra->run = 0;
  ra->run_bytes = 0;
  ra->next = streams ? MAX (ra->next, offset + count) : offset + count;
  r = readahead_direct (ra, buf, count, offset);
  if (r == 0 && (count <= READAHEAD_KEEP_DEEP || !streams))
    readahead_keep_copy (ra, buf, offset, count);
  return r;
}

/* A read one at a time: the run it continues or starts.  A run that
 * ends with its window unread is a reader that stops short, trusted no
 * more until it streams.
 */
static void
readahead_run (struct readahead *ra, uint64_t count, uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  if (offset != ra->next && readahead_unread (ra))
    ra->trusted = false;
  ra->run = offset == ra->next ? ra->run + 1 : 0;
  ra->run_bytes = ra->run > 0 ? ra->run_bytes + count : count;
  if (ra->run_bytes > READAHEAD_STREAM)
    ra->trusted = true;
  ra->next = offset + count;
}

/* Window i filled with [offset, offset+len) (wbuf, taken over), of
 * which the read's count bytes go into buf; ra->lock let go meanwhile.
 */
static int
readahead_fill (struct readahead *ra, int i, uint8_t *wbuf, uint64_t len,
                uint8_t *buf, uint64_t count, uint64_t offset)
  TSA_REQUIRES (ra->lock)
{
  int r;

  readahead_drop (ra, i);
  ra->w[i].buf = wbuf;
  ra->w[i].start = offset;
  ra->w[i].len = len;
  ra->w[i].served = count;
  ra->w[i].state = WINDOW_FILLING;
  ra->busy++;
  ra->fetched += len;
  lock_release (&ra->lock);

  r = readahead_timed (ra, wbuf, len, offset);
  if (r == 0)
    memcpy (buf, wbuf, count);

  lock_acquire (&ra->lock);
  assert (ra->busy > 0 && ra->w[i].state == WINDOW_FILLING);
  ra->busy--;
  ra->w[i].state = r == 0 ? WINDOW_FULL : WINDOW_EMPTY;
  if (r != 0)
    ra->fetched -= len - count; /* the read's own part failed as asked */
  pthread_cond_broadcast (&ra->filled);
  return r;
}

/* A read one at a time that neither windows nor kept pieces hold:
 * fetched with a window more, or as asked (and kept).  No window for a
 * read larger than the one before (grew): the reader grows its own
 * read-ahead (a guest reading a file: 16, 64, 128 KiB...) and asks for
 * what it needs next.  And a window ends where kept pieces begin: it
 * would fetch them again.
 */
static int
readahead_miss (struct readahead *ra, uint8_t *buf, uint64_t count,
                uint64_t offset, bool grew)
  TSA_REQUIRES (ra->lock)
{
  uint64_t end = offset + count, extra, len;
  uint8_t *wbuf;
  int i, r;

  readahead_run (ra, count, offset);
  extra = grew ? 0 : MIN (readahead_extra (ra, count),
                          kept_next (&ra->kept, end) - end);
  /* A window to fill: not the one filling, nor a request as large. */
  i = ra->w[0].state == WINDOW_FILLING ? 1
      : ra->w[1].state == WINDOW_FILLING ? 0
      : ra->w[0].start > ra->w[1].start;
  len = MIN (end + extra, ra->layer->size) - offset;
  wbuf = len > count && count < READAHEAD_WINDOW &&
         ra->w[i].state != WINDOW_FILLING ? malloc (len) : NULL;
  if (wbuf)
    return readahead_fill (ra, i, wbuf, len, buf, count, offset);
  r = readahead_direct (ra, buf, count, offset);
  if (r == 0)
    readahead_keep_copy (ra, buf, offset, count);
  return r;
}

/* [offset, offset+count) of the layer: from a window or a kept piece,
 * or fetched (with a window more, or as asked).
 */
int
readahead_read (struct readahead *ra, uint8_t *buf, uint64_t count,
                uint64_t offset)
  TSA_EXCLUDES (ra->lock)
{
  bool grew;
  int r = 0;

  lock_acquire (&ra->lock);
  grew = count > ra->last_count;
  ra->last_count = count;
  readahead_wait_filling (ra, offset);
  if (!readahead_from_windows (ra, &buf, &count, &offset)) {
    ra->asked += count;
    if (!readahead_from_kept (ra, buf, count, offset, &r))
      r = ra->busy > 0 || ra->deep > 0
        ? readahead_deep_read (ra, buf, count, offset)
        : readahead_miss (ra, buf, count, offset, grew);
  }
  lock_release (&ra->lock);
  return r;
}
