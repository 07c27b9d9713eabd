/* SPDX-License-Identifier: BSD-3-Clause */
/* control-qmp.c's side for control.c (and the protocol's fuzzer and
 * unit test): one client's QMP session, bytes in, lines out.  Nothing
 * here touches a socket, a thread or nbdkit.
 */
#ifndef NBDKIT_QCOW2_CONTROL_QMP_H
#define NBDKIT_QCOW2_CONTROL_QMP_H

#include <stdbool.h>
#include <stddef.h>

struct json_object;
struct json_tokener;

/* A message (from its first byte but whitespace) longer than this is
 * refused, and the session ends.
 */
#define QMP_MESSAGE_MAX (1 << 20)
/* Arrays and objects nested deeper are refused (QEMU's bound). */
#define QMP_DEPTH_MAX 1024

struct qmp_session {
  struct json_tokener *tok;
  /* Between messages (whitespace skipped); in one; or after a JSON
   * error, skipping the rest of the line, up to a '{' (where a message
   * may start again: QEMU's way back into a known state, any ASCII
   * control character, is such an error).
   */
  enum { QMP_BETWEEN, QMP_IN_MESSAGE, QMP_SKIPPING } state;
  size_t taken;                 /* bytes of the message so far */
  bool negotiated;              /* qmp_capabilities done */
  /* Each line the session sends: a JSON object in ASCII, "\r\n" at
   * its end.
   */
  void (*send) (void *opaque, const char *line, size_t len);
  void *opaque;
};

/* Starts a session, its greeting sent.  Returns 0, or -1 (ENOMEM). */
extern int qmp_session_init (struct qmp_session *s,
                             void (*send) (void *opaque, const char *line,
                                           size_t len),
                             void *opaque);
extern void qmp_session_fini (struct qmp_session *s);
/* Takes len bytes from the client: the messages they end are answered
 * (the commands run) in order, a message cut by the end of buf goes on
 * with the next call.  Returns 0, or -1 if the session must end once
 * its output is written (a message over QMP_MESSAGE_MAX: its error
 * sent).
 */
extern int qmp_session_input (struct qmp_session *s, const char *buf,
                              size_t len);

/* A client refused before its session: an error reply (GenericError,
 * desc) sent in place of the greeting.
 */
extern void qmp_refuse (void (*send) (void *opaque, const char *line,
                                      size_t len),
                        void *opaque, const char *desc);

/* o as one line of the protocol: JSON in ASCII (every other character
 * of a string as \uXXXX, a byte that is not UTF-8 as U+FFFD), "\r\n"
 * at its end if crlf.  Returns a string to free (its length in *len),
 * or NULL (ENOMEM).
 */
extern char *qmp_line (struct json_object *o, bool crlf, size_t *len);

#endif /* NBDKIT_QCOW2_CONTROL_QMP_H */
