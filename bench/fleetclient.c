/* SPDX-License-Identifier: BSD-3-Clause */
/* The clients of bench/fleet.sh, one thread a disk, in C with libnbd
 * as a VM's disk client (QEMU's) is: the Python client's threads
 * took turns under one interpreter lock, which the IOPS measured then
 * showed more than the servers.
 *
 *   fleetclient PLAN PAIRS RAW WAVE LATE PREPARE MEASURE...
 *
 * PLAN: "R OFFSET LENGTH" lines, the reads every disk does in order
 * (the first one's data is the first byte), then one
 * "W OFFSET:LENGTH..." line a disk, its writes (each cut at the
 * server's maximum request, as QEMU's client does).  PAIRS:
 * "SOCKET<TAB>EXPORT" lines.  RAW: the base's data, against which
 * every read is checked (no data is checked with FLEETCLIENT_CHECK=0
 * in the environment; FLEETCLIENT_CUT=BYTES cuts requests there, as
 * though the server advertised that maximum).  All
 * but the LATE last disks start in waves of WAVE, each wave once the
 * one before has done its I/O.  Once they all have, with every client
 * still connected, MEASURE (a command) runs.  Then the late disks,
 * one at a time (a VM started while the others run): "PREPARE INDEX"
 * runs (untimed: a server's setup of the disk), then its client, to
 * the end of its I/O.  Prints, of the disks of the waves,
 *   FIRST-BYTE-MEDIAN-MS FIRST-BYTE-P90-MS IOPS READS MIB
 * then the late disks' FIRST-BYTE-MEDIAN-MS (0 if none).  IOPS: the
 * waves' reads over the time spent reading, each wave's from its
 * start to its last read, summed.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#define MIN(a, b) ((a) < (b) ? (a) : (b))

struct extent { uint64_t off; uint32_t len; };

static struct extent *reads;
static size_t nreads;
static unsigned char **want;    /* the base's data of each read */
static struct extent **writes;  /* each disk's writes */
static size_t nwrites;          /* a disk */
static uint32_t write_max;      /* the longest write */
static bool check = true;       /* the data read checked */
static int64_t cut;             /* the longest request, if shorter */
static char **sockets, **exports;
static size_t ndisks;

static double *first_byte, *last_read;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static size_t finished;         /* disks done with their I/O (or failed) */
static bool released;           /* measured: the clients may go */
static char error[512];         /* the first failure, or "" */

static double
fleetclient_now (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void __attribute__ ((noreturn, format (printf, 1, 2)))
fleetclient_die (const char *fmt, ...)
{
  va_list ap;

  fputs ("fleetclient: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (EXIT_FAILURE);
}

static void *
fleetclient_alloc (size_t n)
{
  void *p = calloc (1, n ? n : 1);

  if (p == NULL)
    fleetclient_die ("out of memory");
  return p;
}

/* Reads PLAN and PAIRS (see the top). */
static void
fleetclient_load (const char *plan, const char *pairs)
{
  FILE *fp;
  char *line = NULL;
  size_t cap = 0, nw = 0, wcap = 0;
  ssize_t r;

  fp = fopen (plan, "r");
  if (fp == NULL)
    fleetclient_die ("%s: %m", plan);
  while ((r = getline (&line, &cap, fp)) > 0) {
    if (line[0] == 'R') {
      unsigned long long off;
      unsigned len;

      if (sscanf (line, "R %llu %u", &off, &len) != 2)
        fleetclient_die ("%s: bad line: %s", plan, line);
      reads = realloc (reads, (nreads + 1) * sizeof *reads);
      if (reads == NULL)
        fleetclient_die ("out of memory");
      reads[nreads].off = off;
      reads[nreads++].len = len;
    }
    else if (line[0] == 'W') {
      size_t n = 0;
      char *p = line + 1, *end;
      struct extent *w = fleetclient_alloc (strlen (line) * sizeof *w);

      for (;;) {
        unsigned long long off, len;

        errno = 0;
        off = strtoull (p, &end, 10);
        if (end == p)
          break;
        if (errno || *end != ':')
          fleetclient_die ("%s: bad line: %s", plan, line);
        p = end + 1;
        len = strtoull (p, &end, 10);
        if (errno || end == p || len == 0 || len > 32 << 20)
          fleetclient_die ("%s: bad line: %s", plan, line);
        w[n].off = off;
        w[n++].len = len;
        if (len > write_max)
          write_max = len;
        p = end;
      }
      if (nw > 0 && n != nwrites)
        fleetclient_die ("%s: disks with different numbers of writes", plan);
      nwrites = n;
      if (nw == wcap) {
        wcap = wcap ? 2 * wcap : 64;
        writes = realloc (writes, wcap * sizeof *writes);
        if (writes == NULL)
          fleetclient_die ("out of memory");
      }
      writes[nw++] = w;
    }
    else
      fleetclient_die ("%s: bad line: %s", plan, line);
  }
  fclose (fp);
  if (nreads == 0)
    fleetclient_die ("%s: no reads", plan);

  fp = fopen (pairs, "r");
  if (fp == NULL)
    fleetclient_die ("%s: %m", pairs);
  while ((r = getline (&line, &cap, fp)) > 0) {
    char *tab = strchr (line, '\t');

    if (line[r - 1] == '\n')
      line[r - 1] = '\0';
    if (tab == NULL)
      fleetclient_die ("%s: no tab in: %s", pairs, line);
    *tab = '\0';
    sockets = realloc (sockets, (ndisks + 1) * sizeof *sockets);
    exports = realloc (exports, (ndisks + 1) * sizeof *exports);
    if (sockets == NULL || exports == NULL)
      fleetclient_die ("out of memory");
    sockets[ndisks] = strdup (line);
    exports[ndisks] = strdup (tab + 1);
    if (sockets[ndisks] == NULL || exports[ndisks] == NULL)
      fleetclient_die ("out of memory");
    ndisks++;
  }
  fclose (fp);
  free (line);
  if (ndisks == 0 || nw != ndisks)
    fleetclient_die ("%zu disks in %s, %zu in %s", ndisks, pairs, nw, plan);
}

/* Records a disk's failure (the first one is reported) and that it is
 * done. */
static void __attribute__ ((format (printf, 2, 3)))
fleetclient_fail (size_t i, const char *fmt, ...)
{
  va_list ap;
  char msg[256];

  va_start (ap, fmt);
  vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  pthread_mutex_lock (&lock);
  if (error[0] == '\0')
    snprintf (error, sizeof error, "client %zu (%s): %s", i, exports[i], msg);
  finished++;
  pthread_cond_broadcast (&cond);
  pthread_mutex_unlock (&lock);
}

/* Disk i's write of data over e, in requests of at most max bytes; or,
 * given buf, e read back into it and checked against data.  Returns -1
 * on failure (recorded).
 */
static int
fleetclient_extent (struct nbd_handle *h, size_t i, const struct extent *e,
                    int64_t max, unsigned char *data, unsigned char *buf)
{
  uint32_t done, n;

  for (done = 0; done < e->len; done += n) {
    n = MIN (e->len - done, max);
    if ((buf ? nbd_pread (h, buf, n, e->off + done, 0)
         : nbd_pwrite (h, data, n, e->off + done, 0)) == -1) {
      fleetclient_fail (i, "%s", nbd_get_error ());
      return -1;
    }
    if (buf && check && memcmp (buf, data, n) != 0) {
      fleetclient_fail (i, "write at %" PRIu64 " not read back",
                        e->off + done);
      return -1;
    }
  }
  return 0;
}

/* A disk's client: what bench/fleet.sh's header says. */
static void *
fleetclient_run (void *arg)
{
  size_t i = (uintptr_t) arg, j;
  double t0 = fleetclient_now ();
  struct nbd_handle *h;
  unsigned char *buf, *data;
  int64_t max;

  buf = fleetclient_alloc (write_max > 64 * 1024 ? write_max : 64 * 1024);
  data = fleetclient_alloc (write_max);
  h = nbd_create ();
  if (h == NULL) {
    fleetclient_fail (i, "%s", nbd_get_error ());
    return NULL;
  }
  if (nbd_set_export_name (h, exports[i]) == -1 ||
      nbd_connect_unix (h, sockets[i]) == -1) {
    fleetclient_fail (i, "%s", nbd_get_error ());
    goto out;
  }
  for (j = 0; j < nreads; j++) {
    if (nbd_pread (h, buf, reads[j].len, reads[j].off, 0) == -1) {
      fleetclient_fail (i, "%s", nbd_get_error ());
      goto out;
    }
    if (check && memcmp (buf, want[j], reads[j].len) != 0) {
      fleetclient_fail (i, "wrong data at %" PRIu64 "+%" PRIu32,
                        reads[j].off, reads[j].len);
      goto out;
    }
    if (j == 0)
      first_byte[i] = fleetclient_now () - t0;
  }
  last_read[i] = fleetclient_now ();
  memset (data, i % 251 + 1, write_max);
  max = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  if (max <= 0 || max > 32 << 20)
    max = 32 << 20;
  if (cut && cut < max)
    max = cut;
  for (j = 0; j < nwrites; j++)
    if (fleetclient_extent (h, i, &writes[i][j], max, data, NULL) == -1)
      goto out;
  if (nbd_flush (h, 0) == -1) {
    fleetclient_fail (i, "%s", nbd_get_error ());
    goto out;
  }
  for (j = 0; j < nwrites; j++)
    if (fleetclient_extent (h, i, &writes[i][j], max, data, buf) == -1)
      goto out;

  pthread_mutex_lock (&lock);
  finished++;
  pthread_cond_broadcast (&cond);
  while (!released)
    pthread_cond_wait (&cond, &lock);
  pthread_mutex_unlock (&lock);
  nbd_shutdown (h, 0);
 out:
  nbd_close (h);
  free (buf);
  return NULL;
}

static int
fleetclient_compare (const void *a, const void *b)
{
  double x = *(const double *) a, y = *(const double *) b;

  return (x > y) - (x < y);
}

/* The median and 90th percentile of the n values at v, sorted. */
static void
fleetclient_stats (double *v, size_t n, double *median, double *p90)
{
  size_t j = (size_t) (0.9 * n);

  qsort (v, n, sizeof *v, fleetclient_compare);
  *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  *p90 = v[j < n ? j : n - 1];
}

/* Runs the command argv, which must succeed. */
static void
fleetclient_command (char **argv)
{
  int status;
  pid_t pid;

  fflush (stdout);
  pid = fork ();
  if (pid == -1)
    fleetclient_die ("fork: %m");
  if (pid == 0) {
    execvp (argv[0], argv);
    fprintf (stderr, "fleetclient: %s: %m\n", argv[0]);
    _exit (127);
  }
  if (waitpid (pid, &status, 0) == -1)
    fleetclient_die ("waitpid: %m");
  if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
    fleetclient_die ("%s failed", argv[0]);
}

/* Starts the clients of disks [first, end) together and waits until
 * each has done its I/O.
 */
static void
fleetclient_wave (pthread_t *threads, const pthread_attr_t *attr,
                  size_t first, size_t end)
{
  struct timespec deadline;
  bool failed;
  int r = 0;

  for (size_t i = first; i < end; i++) {
    errno = pthread_create (&threads[i], attr, fleetclient_run,
                            (void *) (uintptr_t) i);
    if (errno)
      fleetclient_die ("pthread_create: %m");
  }
  clock_gettime (CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 300;
  pthread_mutex_lock (&lock);
  while (finished < end && error[0] == '\0' && r != ETIMEDOUT)
    r = pthread_cond_timedwait (&cond, &lock, &deadline);
  failed = error[0] != '\0';
  pthread_mutex_unlock (&lock);
  /* The clients stay connected: a failure ends the process. */
  if (failed)
    fleetclient_die ("%s", error);
  if (r == ETIMEDOUT)
    fleetclient_die ("clients still busy after 300 s");
}

int
main (int argc, char *argv[])
{
  size_t wave, late, nwave, i, j, base;
  pthread_t *threads;
  pthread_attr_t attr;
  double span, median, p90, late_median = 0, late_p90, mib = 0;
  char index[32], *prepare[3];
  int fd;

  if (argc < 8)
    fleetclient_die ("usage: fleetclient PLAN PAIRS RAW WAVE LATE PREPARE "
                     "MEASURE...");
  fleetclient_load (argv[1], argv[2]);
  check = getenv ("FLEETCLIENT_CHECK") == NULL ||
    strcmp (getenv ("FLEETCLIENT_CHECK"), "0") != 0;
  if (getenv ("FLEETCLIENT_CUT"))
    cut = strtoll (getenv ("FLEETCLIENT_CUT"), NULL, 10);
  wave = strtoul (argv[4], NULL, 10);
  if (wave == 0)
    fleetclient_die ("bad wave size: %s", argv[4]);
  late = strtoul (argv[5], NULL, 10);
  if (late >= ndisks)
    fleetclient_die ("%zu late disks of %zu", late, ndisks);
  nwave = ndisks - late;

  fd = open (argv[3], O_RDONLY);
  if (fd == -1)
    fleetclient_die ("%s: %m", argv[3]);
  want = fleetclient_alloc (nreads * sizeof *want);
  for (j = 0; j < nreads; j++) {
    if (reads[j].len > 64 * 1024)
      fleetclient_die ("a read of %" PRIu32 " bytes: at most 64 KiB",
                       reads[j].len);
    want[j] = fleetclient_alloc (reads[j].len);
    if (pread (fd, want[j], reads[j].len, reads[j].off)
        != (ssize_t) reads[j].len)
      fleetclient_die ("%s: short read at %" PRIu64, argv[3], reads[j].off);
    mib += reads[j].len / 1048576.;
  }
  close (fd);

  first_byte = fleetclient_alloc (ndisks * sizeof *first_byte);
  last_read = fleetclient_alloc (ndisks * sizeof *last_read);
  threads = fleetclient_alloc (ndisks * sizeof *threads);
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, 256 * 1024);

  /* The time spent reading: each wave's, from its start to its last
   * read (not its writes and flush, which the next wave waits for).
   */
  span = 0;
  for (base = 0; base < nwave; base += wave) {
    size_t end = MIN (base + wave, nwave);
    double t0 = fleetclient_now (), last = t0;

    fleetclient_wave (threads, &attr, base, end);
    for (i = base; i < end; i++)
      if (last_read[i] > last)
        last = last_read[i];
    span += last - t0;
  }

  /* Every client of the waves connected, its I/O done: the servers
   * measured now.
   */
  fleetclient_command (&argv[7]);

  /* The late disks, one at a time, each made ready first. */
  for (i = nwave; i < ndisks; i++) {
    snprintf (index, sizeof index, "%zu", i);
    prepare[0] = argv[6];
    prepare[1] = index;
    prepare[2] = NULL;
    fleetclient_command (prepare);
    fleetclient_wave (threads, &attr, i, i + 1);
  }

  pthread_mutex_lock (&lock);
  released = true;
  pthread_cond_broadcast (&cond);
  pthread_mutex_unlock (&lock);
  for (i = 0; i < ndisks; i++)
    pthread_join (threads[i], NULL);

  for (i = 0; i < ndisks; i++)
    first_byte[i] *= 1000;
  fleetclient_stats (first_byte, nwave, &median, &p90);
  if (late)
    fleetclient_stats (first_byte + nwave, late, &late_median, &late_p90);
  printf ("%.2f %.2f %.0f %zu %.2f %.2f\n", median, p90,
          nwave * nreads / span, nreads, mib, late_median);
  return EXIT_SUCCESS;
}
