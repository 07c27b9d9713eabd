/* SPDX-License-Identifier: BSD-3-Clause */
/* control=SOCKET: a running server operated live, over QMP as QEMU
 * specifies it (docs/interop/qmp-spec.rst), on a Unix socket of mode
 * 0600.  Two files:
 *
 *   control.c      the socket (made at get_ready, removed at unload),
 *                  its thread (from after_fork to cleanup), its
 *                  clients, events and the periodic tick
 *   control-qmp.c  the protocol: framing and JSON (json-c), the command
 *                  table, the argument helpers, QEMU's errors, and the
 *                  built-in commands qmp_capabilities, query-version
 *                  and query-commands
 *
 * A command is a row of a table registered before get_ready (from
 * .load or .config_complete), run on the control thread, one command
 * at a time across all clients.  It may take the plugin's locks, but
 * must not block for long: while it runs, no other control client is
 * answered, no event is sent and the tick waits.  A command gets its
 * arguments (always an object, empty if the client gave none) and
 * checks them with the helpers below, in the order QEMU's generated
 * code does: each argument of its schema in turn (missing, wrong
 * type), then control_args_only for the keys it does not know; only
 * then does it act (QMP promises clients that a refused command had
 * no effect).  It returns 0 with *ret the return value (a new object
 * it hands over; left NULL, the return is {}), or -1 after
 * control_fail:
 *
 *   static int
 *   cmd_block_job_pause (struct control_call *call,
 *                        struct json_object *args,
 *                        struct json_object **ret)
 *   {
 *     const char *device;
 *
 *     if (control_arg_string (call, args, "device", true, &device) == -1 ||
 *         control_args_only (call, args, (const char *[]) { "device", NULL })
 *           == -1)
 *       return -1;
 *     if (!job_find (device))
 *       return control_fail (call, CONTROL_DEVICE_NOT_ACTIVE,
 *                            "Block job '%s' not found", device);
 *     ...
 *     return 0;
 *   }
 *   static const struct control_command job_commands[] = {
 *     { "block-job-pause", cmd_block_job_pause },
 *   };
 *   ... control_add_commands (job_commands, 1) in .load
 */
#ifndef NBDKIT_QCOW2_CONTROL_H
#define NBDKIT_QCOW2_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_object;

/* QEMU's error classes (qapi/error.json), as the "class" of an error
 * reply.  GenericError for most; CommandNotFound is the protocol's;
 * QEMU answers a block job that does not exist with DeviceNotActive
 * ("Block job 'x' not found") and a device or node that does not with
 * DeviceNotFound.
 */
enum control_class {
  CONTROL_GENERIC_ERROR,
  CONTROL_COMMAND_NOT_FOUND,
  CONTROL_DEVICE_NOT_ACTIVE,
  CONTROL_DEVICE_NOT_FOUND,
};

/* One command being run: what the helpers record its failure in. */
struct control_call;

struct control_command {
  const char *name;             /* QEMU's name, where QEMU has one */
  int (*fn) (struct control_call *call, struct json_object *args,
             struct json_object **ret);
};

/* Registers the n commands of table (which must outlive the server: a
 * static table; it is not copied), answered by name and listed by
 * query-commands after the built-in ones.  Before get_ready: the
 * tables are read without a lock afterwards.  Returns 0, or -1 if a
 * name is taken (a built-in or an earlier row: errno EEXIST) or too
 * many tables were registered (ENOSPC); nothing is logged.
 */
extern int control_add_commands (const struct control_command *table,
                                 size_t n);

/* Fails the call: its error reply will have this class and the
 * description fmt... (one line, as QEMU's: "Block job 'x' not found").
 * Returns -1, for "return control_fail (...)".  A command returning -1
 * without it is answered GenericError "Command failed".
 */
extern int control_fail (struct control_call *call, enum control_class cls,
                         const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

/* The argument key of args, checked as QEMU checks it, each error
 * QEMU's words, class GenericError:
 *   missing and required       "Parameter 'KEY' is missing"
 *   of another type (null too) "Invalid parameter type for 'KEY',
 *                               expected: string|integer|boolean"
 * control_arg_int takes a JSON integer that fits int64_t (2.0 and
 * 1e3 are not integers, as in QEMU); control_arg_string a string
 * without a NUL character ("Parameter 'KEY' must not contain a NUL
 * character": a name cut at it would name another thing), *out
 * pointing into args (valid during the call); control_arg_enum one of
 * words (NULL-terminated), *out its index, another string refused as
 * QEMU refuses it: "Parameter 'KEY' does not accept value 'VALUE'".
 * Each returns 1 with *out set, 0 if the key is absent and not
 * required (*out untouched: set the default first), or -1 after
 * control_fail.
 */
extern int control_arg_string (struct control_call *call,
                               struct json_object *args, const char *key,
                               bool required, const char **out);
extern int control_arg_int (struct control_call *call,
                            struct json_object *args, const char *key,
                            bool required, int64_t *out);
extern int control_arg_bool (struct control_call *call,
                             struct json_object *args, const char *key,
                             bool required, bool *out);
extern int control_arg_enum (struct control_call *call,
                             struct json_object *args, const char *key,
                             bool required, const char *const *words,
                             unsigned *out);
/* Refuses a key of args that is not one of keys (NULL-terminated; NULL:
 * no key at all), as QEMU refuses it: "Parameter 'KEY' is unexpected".
 * Returns 0, or -1 after control_fail.
 */
extern int control_args_only (struct control_call *call,
                              struct json_object *args,
                              const char *const *keys);

/* Sends the event name (QEMU's name, BLOCK_JOB_COMPLETED) with data
 * (an object, or NULL for none; the reference is taken, always) to
 * every client past capabilities negotiation, with QEMU's timestamp
 * (seconds and microseconds of the time of day, taken now), and logs
 * it as one notice line, "event: NAME {DATA}", whether or not
 * control= was given.  From any thread, any lock held: the event is
 * queued, and written by the control thread; an event while no control
 * thread runs (before after_fork, after cleanup) is only logged, and
 * past 1024 events queued and not yet sent, later ones are only
 * logged too (the number dropped is logged once they are sent).
 */
extern void control_event (const char *name, struct json_object *data);

/* fn is called on the control thread every 200 ms or so, or sooner
 * when asked (control_ask_tick), and between commands, never during
 * one, from after_fork to cleanup: a poller that emits events of what
 * changed.  Before after_fork.  With a tick set, the control thread
 * runs even without control= (its events are then only logged).
 */
extern void control_set_tick (void (*fn) (void));
/* The tick run soon, without waiting for its period: a job's state
 * changed.  From any thread, any lock held.
 */
extern void control_ask_tick (void);
/* fd closed by the control thread once the events queued so far are
 * sent (a close that may take long: the last link of a large file).
 * A command's, on the control thread.
 */
extern void control_close_later (int fd);

/* Whether control= was given. */
extern bool control_on (void);

/* qcow2.c's: control= (its row's fn), and the socket and its thread
 * through the server's life.  Each returns 0, or -1 after logging an
 * error.
 */
extern int control_config (const char *key, const char *value);
extern int control_get_ready (void);
extern int control_after_fork (void);
extern void control_cleanup (void);
extern void control_unload (void);

#endif /* NBDKIT_QCOW2_CONTROL_H */
