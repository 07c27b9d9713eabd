/* SPDX-License-Identifier: BSD-3-Clause */
/* What the read-ahead keeps of a layer it fetched: pieces of the layer
 * that do not overlap, sorted by offset, so that a read finds every
 * piece it touches by a binary search and is served from several of
 * them, or fetches only the part none holds.  A piece kept over older
 * ones replaces what they held of its range (a layer never changes, so
 * the bytes are the same).  Memory is counted by allocation: a piece
 * trimmed keeps its buffer until it goes.  The least recently read
 * goes first.  No lock: its owner's guards it.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Returns the first piece ending past offset (ends are sorted too). */
static size_t
kept_first (const struct kept_set *k, uint64_t offset)
{
  size_t lo = 0, hi = k->n;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;

    if (k->p[mid].start + k->p[mid].len <= offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void
kept_remove (struct kept_set *k, size_t i)
{
  assert (i < k->n && k->bytes >= k->p[i].alloc);
  k->bytes -= k->p[i].alloc;
  free (k->p[i].buf);
  memmove (&k->p[i], &k->p[i + 1], (k->n - i - 1) * sizeof k->p[0]);
  k->n--;
}

/* Let go of the piece least recently read. */
static void
kept_evict (struct kept_set *k)
{
  size_t oldest = 0;

  assert (k->n > 0);
  for (size_t i = 1; i < k->n; i++)
    if (k->p[i].used < k->p[oldest].used)
      oldest = i;
  kept_remove (k, oldest);
}

void
kept_free (struct kept_set *k)
{
  for (size_t i = 0; i < k->n; i++)
    free (k->p[i].buf);
  free (k->p);
  k->p = NULL;
  k->n = k->cap = 0;
  k->bytes = 0;
}

uint64_t
kept_copy (struct kept_set *k, uint8_t *buf, uint64_t offset, uint64_t end,
           uint64_t *gap_start, uint64_t *gap_end)
{
  uint64_t pos = offset, covered = 0;

  *gap_start = UINT64_MAX;
  *gap_end = 0;
  for (size_t i = kept_first (k, offset); i < k->n && k->p[i].start < end;
       i++) {
    uint64_t s = MAX (k->p[i].start, offset);
    uint64_t e = MIN (k->p[i].start + k->p[i].len, end);

    if (s > pos) {
      *gap_start = MIN (*gap_start, pos);
      *gap_end = s;
    }
    memcpy (buf + (s - offset), k->p[i].data + (s - k->p[i].start), e - s);
    k->p[i].used = ++k->clock;
    covered += e - s;
    pos = e;
  }
  if (pos < end) {
    *gap_start = MIN (*gap_start, pos);
    *gap_end = end;
  }
  return covered;
}

uint64_t
kept_next (const struct kept_set *k, uint64_t offset)
{
  size_t i = kept_first (k, offset);

  return i < k->n ? MAX (k->p[i].start, offset) : UINT64_MAX;
}

void
kept_add (struct kept_set *k, uint8_t *buf, uint64_t start, uint64_t len)
{
  uint64_t end = start + len;
  size_t i;

  if (len == 0 || len > k->limit) {
    free (buf);
    return;
  }
  /* What older pieces hold of [start, end) is the new one's now. */
  i = kept_first (k, start);
  while (i < k->n && k->p[i].start < end) {
    struct kept_piece *p = &k->p[i];
    uint64_t pend = p->start + p->len;

    if (p->start < start && pend > end) {
      p->used = ++k->clock;     /* it holds all of it already */
      free (buf);
      return;
    }
    if (p->start >= start && pend <= end)
      kept_remove (k, i);
    else if (p->start < start) {
      p->len = start - p->start;
      i++;
    }
    else {
      p->data += end - p->start;
      p->len = pend - end;
      p->start = end;
      i++;
    }
  }
  /* Room made once the pieces it replaces are gone. */
  while (k->n > 0 && (k->bytes + len > k->limit || k->n == KEPT_PIECES))
    kept_evict (k);
  if (k->n == k->cap) {
    size_t cap = k->cap ? 2 * k->cap : 64;
    struct kept_piece *p = realloc (k->p, cap * sizeof *p);

    if (!p) {
      free (buf);               /* keeping only saves fetches */
      return;
    }
    k->p = p;
    k->cap = cap;
  }
  i = kept_first (k, start);
  memmove (&k->p[i + 1], &k->p[i], (k->n - i) * sizeof k->p[0]);
  k->p[i] = (struct kept_piece) {
    .start = start, .len = len, .alloc = len, .used = ++k->clock,
    .buf = buf, .data = buf,
  };
  k->n++;
  k->bytes += len;
}
