/* SPDX-License-Identifier: BSD-3-Clause */
/* nbdio's names (see nbdio.c): an NBD URL made absolute, the nbdkit
 * that serves an http(s) or ssh URL (its arguments), and what went
 * wrong connecting, said with what to do.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <libnbd.h>

#include "nbdio-internal.h"

/* Is cmd an executable file in a folder of PATH? */
static bool
nbdio_in_path (const char *cmd)
{
  const char *p = getenv ("PATH");

  while (p && *p) {
    size_t n = strcspn (p, ":");
    char *f;
    bool ok;

    /* An empty folder is the current one. */
    if (asprintf (&f, "%.*s/%s", n ? (int) n : 1, n ? p : ".", cmd) < 0)
      return true;              /* not known: libnbd's error says */
    ok = access (f, X_OK) == 0;
    free (f);
    if (ok)
      return true;
    p += n + (p[n] == ':');
  }
  return false;
}

/* Connecting: libnbd's error (without the name of the call), with
 * what the user can do about it.
 */
char *
nbdio_connect_error (struct nbdio *io)
{
  const char *err = nbd_get_error ();
  int e = nbd_get_errno ();
  char *why;

  /* libnbd sees only the connection reset. */
  if (io->argv && !nbdio_in_path (io->argv[0]))
    return asprintf (&why, "nbdkit's %s plugin could not be started: "
                     "%s not found in PATH (install nbdkit and its %s "
                     "plugin, or add its folder to PATH)", io->plugin,
                     io->argv[0], io->plugin) < 0 ? NULL : why;
  if (err && strncmp (err, "nbd_", 4) == 0 && strstr (err, ": "))
    err = strstr (err, ": ") + 2;
  if (io->argv && err && strstr (err, "handshake")) {
    /* nbdkit said why on stderr; libnbd only saw it give up.  A
     * redirect to a protocol the admin keeps it from is said so there
     * ("not supported or disabled"): what allows it is said here.
     */
    const char *web = io->opts.web_protocols;
    bool narrow = web && strcmp (io->plugin, "curl") == 0 &&
      strcmp (web, "http,https") != 0;
    return asprintf (&why, "nbdkit's %s plugin cannot serve it (its "
                     "message is above)%s%s%s", io->plugin,
                     narrow ? "; it may use only " : "", narrow ? web : "",
                     narrow ? ", redirects included (backing-protocols=)"
                     : "") < 0 ? NULL : why;
  }
  if (asprintf (&why, "%s%s", err ? err : "the connection failed",
                e == ECONNREFUSED || e == ENOENT
                ? ": is the NBD server running?"
                : err && strstr (err, "getaddrinfo")
                ? ": does the host name resolve?"
                : err && strstr (err, "refused TLS")
                ? " (the server does not offer TLS: nbd:// and nbd+unix:// "
                  "connect without it)"
                : err && strstr (err, "no export")
                ? " (is the export name right?)" : "") < 0)
    why = NULL;
  return why;
}

/* Append "key=value" (or value if key is NULL) to the argv being
 * built.
 */
static int
nbdio_arg (char ***argv, size_t *n, const char *key, const char *value)
{
  char **a = realloc (*argv, (*n + 2) * sizeof **argv);

  if (!a)
    return -1;
  *argv = a;
  if ((key ? asprintf (&a[*n], "%s=%s", key, value)
       : asprintf (&a[*n], "%s", value)) < 0) {
    a[*n] = NULL;
    return -1;
  }
  a[++*n] = NULL;
  return 0;
}

/* An NBD URL with its socket= made absolute, against the folder we are
 * in now (as QEMU, which connects before it forks): nbdkit forking into
 * the background changes to /, and connects again from there.
 */
char *
nbdio_socket_uri (const char *url)
{
  const char *q = strchr (url, '?'), *sock = NULL;
  char *cwd, *r = NULL;
  FILE *fp;
  size_t len;

  for (const char *p = q; p; p = strchr (p + 1, '&'))
    if (strncmp (p + 1, "socket=", 7) == 0)
      sock = p + 8;
  if (!sock || *sock == '/' || strncasecmp (sock, "%2f", 3) == 0)
    return strdup (url);
  if (!(cwd = getcwd (NULL, 0)) || !(fp = open_memstream (&r, &len))) {
    free (cwd);
    return NULL;
  }
  fprintf (fp, "%.*s", (int) (sock - url), url);
  /* The folder percent-encoded, as libnbd decodes the query. */
  for (const char *c = cwd; *c; c++) {
    if (isalnum ((unsigned char) *c) || strchr ("/-._~", *c))
      fputc (*c, fp);
    else
      fprintf (fp, "%%%02X", (unsigned char) *c);
  }
  fprintf (fp, "/%s", sock);
  free (cwd);
  if (fclose (fp) != 0) {
    free (r);
    return NULL;
  }
  return r;
}

/* The nbdkit serving an http(s) or ssh URL: its arguments, or -1 with
 * *why.
 */
int
nbdio_nbdkit_argv (struct nbdio *io, const struct qcow2_remote *remote,
                   char **why)
{
  const char *url = remote->url;
  char ***argv = &io->argv;
  size_t n = 0;
  bool ssh = remote->ssh.host != NULL;
  int r = 0;

  for (const char *a = "nbdkit\0-r\0--exit-with-parent\0"; *a;
       a += strlen (a) + 1)
    r |= nbdio_arg (argv, &n, NULL, a);
  io->plugin = ssh ? "ssh" : "curl";
  if (!ssh) {
    char t[32];
    r |= nbdio_arg (argv, &n, NULL, "curl");
    r |= nbdio_arg (argv, &n, "url", url);
    if (!remote->sslverify)
      r |= nbdio_arg (argv, &n, "sslverify", "false");
    if (remote->timeout) {
      snprintf (t, sizeof t, "%u", remote->timeout);
      r |= nbdio_arg (argv, &n, "timeout", t);
    }
    /* The curl plugin reads "+FILE", "-FD" and "-" as where to find the
     * cookie (nbdkit_read_password): a name in an image must not make
     * the server read its files or descriptors.  QEMU sends the string
     * as it is; nbdkit has no way to, so such a cookie is refused, as
     * is a line break, which would end the header.
     */
    if (remote->cookie &&
        (remote->cookie[0] == '+' || remote->cookie[0] == '-')) {
      if (asprintf (why, "the cookie \"%s\" is refused: nbdkit's curl "
                    "plugin would read it as the name of a file or "
                    "descriptor to read the cookie from, not as the "
                    "cookie", remote->cookie) < 0)
        *why = NULL;
      return -EINVAL;
    }
    if (remote->cookie && strpbrk (remote->cookie, "\r\n")) {
      *why = strdup ("the cookie is refused: it holds a line break");
      return -EINVAL;
    }
    if (remote->cookie)
      r |= nbdio_arg (argv, &n, "cookie", remote->cookie);
    /* Redirects stay on the web (libcurl may follow them elsewhere),
     * and within what the admin allows: an https base redirecting to
     * http:// is not read in clear when only https is.
     */
    r |= nbdio_arg (argv, &n, "protocols", io->opts.web_protocols
                    ? io->opts.web_protocols : "http,https");
    return r ? -ENOMEM : 0;
  }

  /* The URL's parts, as the engine split it. */
  r |= nbdio_arg (argv, &n, NULL, "ssh");
  r |= nbdio_arg (argv, &n, "host", remote->ssh.host);
  if (remote->ssh.port)
    r |= nbdio_arg (argv, &n, "port", remote->ssh.port);
  if (remote->ssh.user)
    r |= nbdio_arg (argv, &n, "user", remote->ssh.user);
  r |= nbdio_arg (argv, &n, "path", remote->ssh.path);
  if (!remote->ssh.verify_host)
    r |= nbdio_arg (argv, &n, "verify-remote-host", "false");
  return r ? -ENOMEM : 0;
}
