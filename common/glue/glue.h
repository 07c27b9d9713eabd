/* SPDX-License-Identifier: BSD-3-Clause */
/* What the qcow2 plugin and the qcow2 filter share of their nbdkit
 * glue, from the top down (tests/layering-rim.py checks that calls go
 * down): stream.c (stream=true); glue.c, the options that tune the
 * engine, parsed from tables; policy.c, what images may name; log.c,
 * the engine's messages to nbdkit's log, what is logged of an image
 * opened, repair=leaks; parse.c, the values' parsers; password.c;
 * introspect.c, what nbdkit's API does not tell.  Each module links its own copy, holding its own options in
 * glue.
 */
#ifndef QCOW2_GLUE_H
#define QCOW2_GLUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fileio.h"
#include "qcow2.h"

/* Threads reading the host runs of one request at once, by default,
 * and at most: more cost memory and start-up time, and gain nothing on
 * the few queues storage has.
 */
#define GLUE_IO_THREADS 4
#define GLUE_IO_THREADS_MAX 64
/* The filter's default: below it may be a network, where a request
 * costs a round trip, and a 1 MiB read of 64 KiB clusters scattered is
 * 16 pieces, all issued at once by the requester and 15 more threads.
 */
#define GLUE_IO_THREADS_FILTER 16

/* The image create= makes: size= and the options that only describe
 * it (those both modules take).
 */
struct glue_create {
  struct qcow2_create_options opts;
  /* encrypt-format=luks points opts.luks here; the strings malloc'd. */
  struct qcow2_luks_options luks;
  bool compression_type_set;    /* compression-type= given */
  /* Given, though the default (create=if-missing compares them). */
  bool compat_set, extended_l2_set, lazy_refcounts_set, data_file_raw_set;
  int64_t size;                 /* -1: not given */
  const char *first_key;        /* the first such key given, or NULL */
};

/* The admin's policy for the files and servers images name (policy.c):
 * backing-protocols= (protocols: bits in the order file, nbd, nbds,
 * http, https, ssh), backing-root= (resolved), backing-insecure=false,
 * backing-tls-*= for nbds:// (absolute paths).
 */
struct glue_policy {
  bool protocols_set;
  unsigned protocols;
  char *protocols_text;         /* as given, for messages */
  char *root;
  bool refuse_insecure;
  char *tls_certificates, *tls_psk_file, *tls_username;
};

/* The options both modules take, as parsed. */
struct glue_state {
  struct qcow2_options engine;
  char *snapshot;
  /* password= (a NULL text if not given), then backing-password= in
   * the order given: the engine's passwords, wiped once the image is
   * open (or at unload).
   */
  struct qcow2_password *passwords;
  unsigned passwords_len;
  /* Whether password= and backing-password= were given: kept once
   * the passwords are wiped, for glue_opened.
   */
  bool password_given, backing_password_given;
  bool repair_leaks;            /* repair=leaks: before serving */
  /* overlap-check=MODE and overlap-check.NAME=on|off, the latter
   * overriding the former whatever their order, as in QEMU.
   */
  uint32_t overlap_on, overlap_off;
  struct glue_create create;
  /* remote-timeout=: seconds (0: nbdio's default). */
  unsigned remote_timeout;
  /* max-request=: the longest request advertised (glue_block_size). */
  uint64_t max_request;
  struct glue_policy policy;
};
extern struct glue_state glue;

/* The block sizes both modules advertise. */
extern void glue_block_size (uint32_t *minimum, uint32_t *preferred,
                             uint32_t *maximum);

/* One key of a module's options: how its value is read, and where it
 * goes.
 */
struct glue_option {
  const char *key;
  enum {
    GLUE_PATH,                  /* made absolute, into a char * */
    GLUE_STRING,                /* into a char * */
    GLUE_BOOL,                  /* into a bool */
    GLUE_SIZE,                  /* into a uint64_t, not zero */
    GLUE_WORD,                  /* one of words, to set */
    GLUE_FN,                    /* fn does it all */
  } kind;
  bool create_only;             /* describes the image create= makes */
  bool prefix;                  /* key is a prefix: overlap-check.NAME */
  bool any_value;               /* a value may hold ",KEY=" (a password) */
  void *dest;
  bool *given;                  /* set when the key is given, or NULL */
  const char *const *words;     /* NULL-terminated */
  void (*set) (unsigned index);
  int (*fn) (const char *key, const char *value);
};

/* Takes a key of the options both modules take (glue.c's tables: the
 * engine's, and those describing an image to create), else of the
 * module's own table t of n rows.  Returns 1 if done, 0 if no table
 * has the key, -1 on error (logged, naming the key); sets *row (if row
 * is not NULL) to the row used, or NULL.  The first key given that
 * only describes an image to create (a row marked
 * create_only) is noted in glue.create.first_key.  options=LIST takes
 * a qemu-img -o list (KEY=VALUE,..., ",," a comma), each key as if
 * given alone; a value that holds such a list is refused, naming
 * options=.
 */
extern int glue_config (const struct glue_option *t, size_t n,
                        const char *key, const char *value,
                        const struct glue_option **row);
/* Takes key=value by the table t of n rows alone.  Returns 1 if done,
 * 0 if the table has no such key, -1 on error (logged, naming the
 * key); sets *row (if row is not NULL) to the row used, or NULL.
 */
extern int glue_config_rows (const struct glue_option *t, size_t n,
                             const char *key, const char *value,
                             const struct glue_option **row);
/* The virtual size of an image to create, as a row's fn: the plugin
 * calls it size=, the filter virtual-size= (plugins take size=).
 */
extern int glue_config_create_size (const char *key, const char *value);
/* The password of LUKS images, as a row's fn: SECRET, -, +FILE or
 * -FD, as nbdkit reads passwords.  The plugin calls it password=, the
 * filter qcow2-password= (plugins below take password=).
 */
extern int glue_config_password (const char *key, const char *value);
/* The password of the next backing layer (the first given is that of
 * the image's backing file), as a row's fn: the plugin calls it
 * backing-password=, the filter qcow2-backing-password=.
 */
extern int glue_config_backing_password (const char *key, const char *value);
/* Returns password= (of the image itself), or NULL. */
static inline const char *
glue_password (void)
{
  return glue.passwords_len ? glue.passwords[0].text : NULL;
}
/* Compares the image name that create=if-missing found, opened as img,
 * with glue.create.  Returns -1 (logged) if serving it would serve
 * another disk than glue.create describes (smaller than size=, other
 * encryption, other backing file), else 0, with a notice if it is
 * larger (resized since) or other format options differ.
 */
extern int glue_create_compare (struct qcow2_image *img, const char *name);
/* Refuses an image made (when: the option making it, "create=true")
 * with a password but without encrypt-format=luks, as qemu-img refuses
 * it ("Parameter 'encrypt.format' is missing"), since the password of
 * an image made unencrypted would protect nothing.  Returns 0, or -1
 * after logging an error.
 */
extern int glue_create_check_password (const char *when);
/* The policy's keys, as rows' fns (policy.c). */
extern int glue_config_backing_protocols (const char *key, const char *value);
extern int glue_config_backing_root (const char *key, const char *value);
extern int glue_config_backing_insecure (const char *key, const char *value);
extern void glue_policy_free (void);
/* glue_env's open and open_remote: apply the policy, then open through
 * fileio or nbdio.
 */
extern struct qcow2_io *glue_policy_open (void *opaque, const char *path,
                                          bool readonly, char **id);
extern struct qcow2_io *glue_policy_open_remote (
  void *opaque, const struct qcow2_remote *remote, char **why);
/* After the last key, completes glue.engine.  Returns 0, or -1 on error
 * (logged).
 */
extern int glue_config_complete (void);
extern void glue_unload (void);
/* Wipe the passwords from memory (at unload). */
extern void glue_forget_password (void);

/* parse.c: parsers that name the option in their errors. */
extern int glue_parse_size (const char *key, const char *value, bool zero_ok,
                            uint64_t *out);
extern int glue_parse_bool (const char *key, const char *value, bool *out);
/* Parses a folder, its path resolved (every link followed), into *dir
 * (replacing it).
 */
extern int glue_parse_folder (const char *key, const char *value,
                              char **dir);
/* Whether path lies under folder (both resolved); "/" holds all. */
extern bool glue_in_folder (const char *path, const char *folder);
/* Parses a number from 0 to max; what says what it counts, for the
 * error.
 */
extern int glue_parse_number (const char *key, const char *value,
                              const char *what, uint64_t max, uint64_t *out);
/* As glue_parse_number, from min. */
extern int glue_parse_range (const char *key, const char *value,
                             const char *what, uint64_t min, uint64_t max,
                             uint64_t *out);
/* Parses one of a few words.  Returns its index in words
 * (NULL-terminated), or -1 after logging an error listing them.
 */
extern int glue_parse_word (const char *key, const char *value,
                            const char *const *words);

/* Called from the module's .load with its name (for its messages), the
 * option that gives the password, and the default of io-threads.
 */
extern void glue_load (const char *name, const char *password_key,
                       unsigned io_threads);

/* The engine's messages, to nbdkit's log.  Notices (not errors, but
 * the user must hear of them) go where nbdkit logs, with "notice"
 * where nbdkit writes "error" (nbdkit, to 1.45, gives modules no level
 * between debug, shown with -v only, and error): to stderr, syslog, a
 * file or nowhere, as nbdkit's --log says, and as nbdkit decides when
 * it is not given (syslog once nbdkit runs in the background).
 */
extern void glue_error (void *opaque, const char *msg);
/* The engine's remedy of its error (qcow2_env's hint), as glue_hint. */
extern void glue_env_hint (void *opaque, const char *msg);
extern void glue_debug (void *opaque, const char *msg);
extern void glue_notice (void *opaque, const char *path, const char *msg);
extern void glue_noticef (const char *path, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));
/* Logs the remedy of the error just logged, as a second line ("hint:
 * ..."):
 * errors are one short line (what failed, where), as nbdkit's.
 */
extern void glue_hint (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
/* Cuts why (a reason from fileio, if not NULL) at its remedy, which
 * follows a newline: returns the remedy, for glue_hint after the error
 * naming why, or NULL if it has none.
 */
extern const char *glue_why_remedy (char *why);
/* Logs "FMT...: why" as an error (errstr (err) without why), and
 * why's remedy as a hint; frees why.
 */
extern void glue_file_error (char *why, int err, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* Local files (the plugin's image, every backing file): how they are
 * opened (locking=, cache=), and the engine's environment opening them,
 * and remote backing files (through libnbd: nbdio.h).
 */
extern struct fileio_options glue_file_options;
extern struct qcow2_env glue_env;

/* Checks the image named name once open: a password given while neither
 * the image nor a backing file is encrypted is refused (the admin
 * believes the disk encrypted, and it is not); as QEMU, an image
 * marked corrupt is refused unless read-only was asked
 * (asked_readonly, or a snapshot served); an image
 * served read-only unasked is logged, with why (NULL: the engine's
 * reason).  Returns 0, or -1 after logging an error.
 */
extern int glue_opened (struct qcow2_image *img, const char *name,
                        bool asked_readonly, const char *why);
/* glue_opened's refusals alone, nothing logged otherwise (the filter's
 * check before nbdkit forks of an image it opens again after).
 */
extern int glue_opened_check (struct qcow2_image *img, const char *name,
                              bool asked_readonly);

/* Runs repair=leaks on the image named name.  Returns 0, or -1 after
 * logging an error.
 */
extern int glue_repair (struct qcow2_image *img, const char *name);

/* -D qcow2.cache=1 and -D qcow2.flush=1 (each module has its own).
 * glue_close_stats: the L2 cache's totals, at the end of a connection;
 * glue_flushed: the host flushes so far, after a client's flush.
 */
extern int qcow2_debug_cache, qcow2_debug_flush;
extern void glue_close_stats (struct qcow2_image *img);
extern void glue_flushed (struct qcow2_image *img);

/* nbdkit --dump-plugin: what this build reads and writes (qcow2_*). */
extern void glue_dump_plugin (void);

/* introspect.c: what nbdkit's API does not tell modules,
 * inferred (that file says from what, and what would retire it).
 */
/* Whether nbdkit is 1.MINOR.MICRO or later: the headers' version is the
 * version of the nbdkit this build loads into (configure checks).  The
 * includer has included nbdkit-plugin.h or nbdkit-filter.h.
 */
#ifndef NBDKIT_VERSION_MINOR
#error "glue.h: include nbdkit-plugin.h or nbdkit-filter.h first"
#endif
#define GLUE_NBDKIT_AT_LEAST(minor, micro)                         \
  (NBDKIT_VERSION_MAJOR > 1 || NBDKIT_VERSION_MINOR > (minor) ||   \
   (NBDKIT_VERSION_MINOR == (minor) && NBDKIT_VERSION_MICRO >= (micro)))
extern void glue_introspect_load (void);
/* Whether nbdkit serves read-only (-r), before any connection. */
extern bool glue_server_readonly (void);
#if !GLUE_NBDKIT_AT_LEAST (35, 9)
/* Whether nbdkit was asked to --dump-plugin (filters have no
 * .dump_plugin before nbdkit 1.35.9).
 */
extern bool glue_dump_asked (void);
#endif
/* Whether nbdkit runs a --run command. */
extern bool glue_captive (void);
/* A notice of the module, on path, where nbdkit logs (glue_notice). */
extern void glue_log_notice (const char *module, const char *path,
                             const char *msg);
/* The name of the plugin nbdkit loaded ("file"), or "" if not known. */
#define GLUE_PLUGIN_NAME_MAX 64
extern void glue_plugin_name (char name[GLUE_PLUGIN_NAME_MAX]);
/* Returns the filters given below the filter self ("qcow2") on nbdkit's
 * command line, top first: "--filter=offset --filter=xz", "" if none,
 * or NULL on error (errno).
 */
extern char *glue_filters_below (const char *self);
/* Returns open (opaque), with nbdkit's "no connection in this thread"
 * error (logged when a plugin asks for the client's export name in a
 * context that has no client; "no context" from 1.43.9) left out of
 * nbdkit's stderr.
 */
extern void *glue_quiet_open (void *(*open) (void *opaque), void *opaque);
/* A module opening what it serves at after_fork (the filter), heard
 * as at get_ready: glue_start_watch at get_ready; glue_start_begin as
 * after_fork begins; glue_start_end as it ends, ready or not (the
 * server then exits).  In the background, nbdkit's first process exits
 * once the server is ready, or with status 1, having shown what the
 * server logged meanwhile.  A server not ready leaves no pid file or
 * Unix socket, and under --run the command's client is refused at once.
 */
extern void glue_start_watch (void);
extern void glue_start_begin (void);
extern void glue_start_end (bool ready);

/* stream.c: stream=true (the filter: qcow2-overlay-stream=true)
 * and its companions, as each module's table parses them.
 */
struct glue_stream {
  bool on;
  char *base;                   /* stream-base=NAME, or NULL */
  uint64_t rate;                /* stream-rate=, bytes/s (0: no limit) */
  bool detach;                  /* stream-detach= (true) */
  bool rate_given, detach_given;
};
extern struct glue_stream glue_stream;
/* At config_complete, refuses the companions of key=true (stream, or
 * qcow2-overlay-stream: key-base=, key-rate=, key-detach=) given
 * without it.  Returns 0, or -1 after logging an error.
 */
extern int glue_stream_config_complete (const char *key);
extern int qcow2_debug_stream;
/* The job of one image, for a module serving several (the plugin's
 * dir=; its file= too): made once the image named name is open (key
 * names stream=true in the message refusing a read-only image), busy
 * the count of the image's requests in flight the job yields to (NULL:
 * none).  Returns 0 with *job the job, or NULL if stream= is off; or -1
 * after logging an error.  A job with nothing to stream (the image has
 * no backing file: a notice says so) is one still, whose description is
 * NULL.
 */
struct glue_stream_job;
extern int glue_stream_job_new (struct qcow2_image *img, const char *name,
                                const char *key, bool readonly,
                                const unsigned *busy,
                                struct glue_stream_job **job);
/* A job asked for by the control socket (block-stream): its own base,
 * rate and detach.
 */
struct glue_stream_spec {
  const char *base;
  uint64_t rate;
  bool detach;
};
/* block-stream: a job as spec says made and started on the image
 * named name, in *jobp (made if NULL; made again if its last job has
 * ended).  Returns 0, or -1 with errno: EBUSY, a job runs; ENOENT,
 * nothing to stream; else the error logged.
 */
extern int glue_stream_job_run (struct glue_stream_job **jobp,
                                struct qcow2_image *img, const char *name,
                                const struct glue_stream_spec *spec,
                                const unsigned *busy);
/* Starts its thread (after nbdkit forks).  Returns 0, or -1 after
 * logging an error.  NULL: nothing done.
 */
extern int glue_stream_job_start (struct glue_stream_job *job);
/* Stops it where it is, and frees it: before the image closes (no
 * request in flight).  A job made again on the image goes on from where
 * the image stands.
 */
extern void glue_stream_job_free (struct glue_stream_job *job);
/* The job started by the first request (glue_stream_job_kick, at each
 * one), not now: an image opened only to be looked at streams nothing.
 */
extern void glue_stream_job_arm (struct glue_stream_job *job);
extern void glue_stream_job_kick (struct glue_stream_job *job);
/* How far the job got: false if there is none now (*cancelled: it was
 * cancelled).
 */
extern bool glue_stream_job_progress (struct glue_stream_job *job,
                                      struct qcow2_stream_progress *p,
                                      bool *cancelled);
/* The control socket's hold on a running job: 0, or -1 if it has none. */
enum glue_stream_do {
  GLUE_STREAM_PAUSE, GLUE_STREAM_RESUME, GLUE_STREAM_SET_RATE,
  GLUE_STREAM_CANCEL,
};
extern int glue_stream_job_control (struct glue_stream_job *job,
                                    enum glue_stream_do what, uint64_t rate);
/* The export description while it runs or once it ended ("streaming:
 * 43%, ...", as glue_stream_description), or NULL (job NULL, or
 * nothing to stream).  *settled says whether the job, at that point,
 * will no longer change the image's backing file (it ended, or there is
 * none): until then the header's name (as qcow2_get_info gives it) may
 * be swapped by the job's detach at any time, and must not be read.
 */
extern const char *glue_stream_job_description (struct glue_stream_job *job,
                                                bool *settled);
/* The module's one job (the filter's overlay): once the image named
 * name is open (before nbdkit forks), checks the job (key names
 * stream=true in the message refusing a read-only image).  Returns 0,
 * or -1 after logging an error.
 */
extern int glue_stream_prepare (struct qcow2_image *img, const char *name,
                                const char *key, bool readonly);
/* After the fork, starts the job's thread.  Returns 0, or -1 after
 * logging an error.
 */
extern int glue_stream_start (void);
/* Before the image closes. */
extern void glue_stream_stop (void);
/* Around each client request (the job yields to them). */
extern void glue_stream_enter (void);
extern void glue_stream_leave (void);
/* Returns the export description while a job runs ("streaming: 43%,
 * ..."), or NULL.
 */
extern const char *glue_stream_description (void);

/* --help: the options both modules take, but io-threads= (whose
 * default differs) and the create options (in each module's order).
 */
#define GLUE_CONFIG_HELP \
  "snapshot=<NAME|ID>              Serve an internal snapshot (read-only).\n" \
  "readonly=true                   Never write the image.\n" \
  "discard=unmap|ignore            Whether trim frees space (default unmap).\n" \
  "repair=leaks                    Reclaim leaked clusters before serving.\n" \
  "compress=off|on|zlib|zstd       Store whole new clusters compressed (off).\n" \
  "locking=auto|on|off             QEMU's image locks on local files (auto).\n" \
  "remote-timeout=<SECS>           Remote backing files: a request fails when\n" \
  "                                the server answers nothing that long (30).\n" \
  "backing-protocols=<LIST>        What backing names may reach: file, nbd,\n" \
  "                                nbds, http, https, ssh (default: all).\n" \
  "backing-root=<DIR>              Local backing/data files only under DIR.\n" \
  "backing-insecure=false          Refuse names turning off TLS/host key checks.\n" \
  "backing-tls-certificates=<DIR>  nbds:// bases: X.509 credentials in DIR.\n" \
  "backing-tls-psk-file=<FILE>     nbds:// bases: pre-shared keys in FILE.\n" \
  "backing-tls-username=<NAME>     nbds:// bases: the TLS user name.\n" \
  "overlap-check=none|constant|cached|all  Metadata overlap guard (cached).\n" \
  "overlap-check.<STRUCTURE>=on|off        One structure of the guard.\n" \
  "l2-cache-size=<SIZE>            L2 cache size (default: whole disk, capped).\n" \
  "l2-slice-size=<SIZE>            L2 cache entry size (512 to cluster size).\n" \
  "max-request=<SIZE>              The longest request advertised\n" \
  "                                (4K to 32M, default 32M).\n"
/* The create options both modules take, one key a line at the start
 * of it, as nbdkit's bash completion finds keys in --help (each module
 * adds preallocation=, whose values differ).
 */
#define GLUE_CREATE_HELP \
  "cluster-size=<SIZE>             Its cluster size (64K).\n" \
  "compat=0.10|1.1                 Its qcow2 version, 2 or 3 (1.1).\n" \
  "extended-l2=on                  Subclusters (compat=1.1, 16K clusters\n" \
  "                                or more).\n" \
  "lazy-refcounts=on               Refcounts made durable lazily.\n" \
  "refcount-bits=<N>               Refcount width, 1 to 64 bits (16).\n" \
  "compression-type=zlib|zstd      Of its compressed clusters (zlib).\n" \
  "encrypt-format=luks             Encrypted with LUKS, keyed by the\n" \
  "                                password.\n" \
  "encrypt-cipher-alg=<ALG>        LUKS's cipher (aes-256).\n" \
  "encrypt-cipher-mode=<MODE>      Its mode (xts).\n" \
  "encrypt-ivgen-alg=<ALG>         Its IV generator (plain64).\n" \
  "encrypt-ivgen-hash-alg=<HASH>   ESSIV's hash (sha256).\n" \
  "encrypt-hash-alg=<HASH>         PBKDF2's hash (sha256).\n" \
  "encrypt-iter-time=<MS>          PBKDF2's time (2000 ms).\n" \
  "options=<KEY=VALUE,...>         The same as a qemu-img -o list.\n"
#define GLUE_CREATE_SPELLINGS_HELP \
  "  (qemu-img's spellings too: cluster_size=, lazy_refcounts=, ...)"

#endif /* QCOW2_GLUE_H */
