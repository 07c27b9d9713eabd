/* SPDX-License-Identifier: BSD-3-Clause */
/* A slice pointer kept past its entry's eviction (against cache_get's
 * contract) must fail, not change another table: under
 * AddressSanitizer (CI's sanitizer stage, the fuzzer) reading through
 * it is a use after free, and cache_mark_dirty asserts it is a live
 * entry's.  Each is tried in a child process, which must die.  Without
 * AddressSanitizer a stale pointer points into the array of entries and
 * cannot be told from a live one: only the live cases are checked.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "memio.h"
#include "unit.h"

#define SLICE 512

static struct qcow2_image img;

/* Whether fn (p) kills a child process. */
static bool
dies (void (*fn) (uint8_t *p), uint8_t *p)
{
  int status;
  pid_t pid = fork ();

  if (pid == 0) {
    /* The sanitizer's report and the assertion's message are
     * expected: keep them out of the test's log.
     */
    if (!freopen ("/dev/null", "w", stderr))
      _exit (2);
    fn (p);
    _exit (0);
  }
  if (pid < 0 || waitpid (pid, &status, 0) != pid)
    return false;
  return !(WIFEXITED (status) && WEXITSTATUS (status) == 0);
}

static void
read_through (uint8_t *p)
{
  volatile uint8_t v = p[0];
  (void) v;
}

/* Called in the child of a fork made with img.lock held (main). */
static void
mark_dirty (uint8_t *p)
  TSA_REQUIRES (img.lock)
{
  cache_mark_dirty (&img, img.caches.l2, p);
}

int
main (void)
{
  static uint8_t file[3 * SLICE];
  struct qcow2_env env = { 0 };
  uint8_t *a, *b, *c;

  for (unsigned i = 0; i < 3; i++)
    memset (file + i * SLICE, 'a' + i, SLICE);
  img.env = &env;
  img.path = (char *) "stale.qcow2";
  img.io = memio_new (file, sizeof file);
  img.caches.l2 = cache_create (CACHE_L2, SLICE, 2);
  CHECK (img.io && img.caches.l2);
  lock_init (&img.lock);
  image_lock (&img);

  CHECK_INT (cache_get (&img, img.caches.l2, 0, &a), 0);
  CHECK_INT (a[0], 'a');
  CHECK_INT (cache_get (&img, img.caches.l2, SLICE, &b), 0);
  CHECK_INT (b[0], 'b');
  /* Two entries: the third slice evicts the first, a. */
  CHECK_INT (cache_get (&img, img.caches.l2, 2 * SLICE, &c), 0);
  CHECK_INT (c[0], 'c');
  CHECK (!dies (read_through, c));
  CHECK (!dies (mark_dirty, c));
#ifdef QCOW2_ASAN
  CHECKF (dies (read_through, a), "a read through a stale slice pointer "
          "did not fail under AddressSanitizer");
  CHECKF (dies (mark_dirty, a), "cache_mark_dirty took a stale slice "
          "pointer");
#else
  printf ("not built with AddressSanitizer: stale pointers not tried\n");
#endif
  /* The live entry is still there, unchanged. */
  CHECK_INT (cache_get (&img, img.caches.l2, 2 * SLICE, &c), 0);
  CHECK_INT (c[0], 'c');

  image_unlock (&img);
  cache_destroy (img.caches.l2);
  img.io->ops->close (img.io);
  lock_destroy (&img.lock);
  return unit_finish ();
}
