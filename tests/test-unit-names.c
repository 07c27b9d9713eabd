/* SPDX-License-Identifier: BSD-3-Clause */
/* Backing file names QEMU accepts, at any depth of a chain: URLs,
 * QEMU's legacy nbd: syntax, json: names in the forms QEMU writes
 * (nested objects and dotted keys, legacy keys), what each is opened
 * as (the in-memory environment keeps remote storage under its URL
 * and records the options), relative names of a remote image resolved
 * as QEMU resolves them, json's raw offset and size, and the clear
 * refusals.
 */
#include "unit-engine.h"
#include "internal.h"         /* name_parse */

/* A one-cluster v3 image (data in cluster 0) naming name as its
 * backing file, with format fmt (NULL: none).
 */
static void
ib_naming (struct ib *ib, const char *name, const char *fmt, uint32_t seed)
{
  ib_init (ib, 3, 16, 4 * 65536, false);
  ib->backing = name;
  ib->backing_format = fmt;
  ib_data (ib, 0, seed);
  ib_finish (ib);
}

/* A raw base of 4 clusters. */
static uint8_t *
raw_base (struct model *m, uint32_t seed)
{
  uint8_t *raw = malloc (4 * 65536);

  if (!raw)
    abort ();
  for (uint64_t i = 0; i < 4 * 65536; i++)
    raw[i] = model_pattern (false, seed, i);
  *m = (struct model) { .size = 4 * 65536, .raw = raw };
  return raw;
}

/* top.qcow2 names name (format fmt) over the raw base registered as
 * storage, whose remote options must read as want_remote (NULL: the
 * base is a local file): the chain reads as its model.
 */
static void
check_name (const char *name, const char *fmt, const char *storage,
            const char *want_remote)
{
  struct memenv *me = memenv_new ();
  struct model base;
  uint8_t *raw = raw_base (&base, 7);
  struct qcow2_image *img;
  struct ib top;

  add_file (me, storage, raw, base.size);
  ib_naming (&top, name, fmt, 1);
  top.model.backing = &base;
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "%s: open: %s", name, memenv_last_error (me))) {
    check_reads (img, &top.model, 0, 4 * 65536, name);
    qcow2_close (img);
  }
  if (want_remote)
    CHECKF (strcmp (memenv_last_remote (me), want_remote) == 0,
            "%s: opened \"%s\", expected \"%s\"", name,
            memenv_last_remote (me), want_remote);
  else
    CHECKF (memenv_last_remote (me)[0] == '\0', "%s: opened \"%s\" remotely",
            name, memenv_last_remote (me));
  ib_free (&top);
  free (raw);
  memenv_free (me);
}

static void
test_names (void)
{
  check_name ("nbd+unix:///exp?socket=/tmp/s", "raw",
              "nbd+unix:///exp?socket=/tmp/s",
              "nbd+unix:///exp?socket=/tmp/s sslverify=1 timeout=0 cookie=");
  check_name ("nbd://h:10810/x", "raw", "nbd://h:10810/x",
              "nbd://h:10810/x sslverify=1 timeout=0 cookie=");
  check_name ("nbd+tcp://h/x", "raw", "nbd://h/x",
              "nbd://h/x sslverify=1 timeout=0 cookie=");
  check_name ("http://web/d/base.raw", "raw", "http://web/d/base.raw",
              "http://web/d/base.raw sslverify=1 timeout=0 cookie=");
  /* Schemes in any case (RFC 3986), opened in lower case; the rest of
   * the URL as it is.
   */
  check_name ("HTTP://web/D/base.raw", "raw", "http://web/D/base.raw",
              "http://web/D/base.raw sslverify=1 timeout=0 cookie=");
  check_name ("Nbd+Unix:///exp?socket=/tmp/S", "raw",
              "nbd+unix:///exp?socket=/tmp/S",
              "nbd+unix:///exp?socket=/tmp/S sslverify=1 timeout=0 cookie=");
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"https\","
              "\"url\":\"HTTPS://web/b.raw\"}}", NULL, "https://web/b.raw",
              "https://web/b.raw sslverify=1 timeout=0 cookie=");
  /* QEMU's legacy syntax. */
  check_name ("nbd:unix:/tmp/s:exportname=e", "raw", "nbd+unix:///e?socket=/tmp/s",
              "nbd+unix:///e?socket=/tmp/s sslverify=1 timeout=0 cookie=");
  check_name ("nbd:h:1234", "raw", "nbd://h:1234/",
              "nbd://h:1234/ sslverify=1 timeout=0 cookie=");
  check_name ("nbd:[::1]:10810:exportname=e", "raw", "nbd://[::1]:10810/e",
              "nbd://[::1]:10810/e sslverify=1 timeout=0 cookie=");
  /* json: nested, dotted, legacy keys; the format from the name. */
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
              "\"server\":{\"type\":\"unix\",\"path\":\"/run/nbd sock\"}}}",
              NULL, "nbd+unix:///?socket=/run/nbd%20sock",
              "nbd+unix:///?socket=/run/nbd%20sock sslverify=1 timeout=0 "
              "cookie=");
  check_name ("json:{\"driver\": \"raw\", \"file\": {\"server.host\": "
              "\"localhost\", \"server.port\": \"10809\", \"driver\": "
              "\"nbd\", \"server.type\": \"inet\", \"export\": \"a b/c\"}}",
              "raw", "nbd://localhost:10809/a%20b/c",
              "nbd://localhost:10809/a%20b/c sslverify=1 timeout=0 cookie=");
  check_name ("json:{\"file.driver\":\"nbd\",\"file.host\":\"::1\","
              "\"file.port\":10811}", "raw", "nbd://[::1]:10811/",
              "nbd://[::1]:10811/ sslverify=1 timeout=0 cookie=");
  check_name ("json:{\"driver\":\"nbd\",\"path\":\"/s\"}", "raw",
              "nbd+unix:///?socket=/s",
              "nbd+unix:///?socket=/s sslverify=1 timeout=0 cookie=");
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"https\","
              "\"url\":\"https://web/b\\u00e9.raw\",\"sslverify\":false,"
              "\"timeout\":7,\"cookie\":\"k=v\",\"readahead\":65536}}",
              "raw", "https://web/b\xc3\xa9.raw",
              "https://web/b\xc3\xa9.raw sslverify=0 timeout=7 cookie=k=v");
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"ssh\","
              "\"server\":{\"host\":\"h\",\"port\":\"2222\"},\"user\":\"u\","
              "\"path\":\"/img/base.raw\",\"host-key-check\":{\"mode\":"
              "\"none\"}}}", "raw", "ssh://u@h:2222/img/base.raw?host_key_check=no",
              "ssh://u@h:2222/img/base.raw?host_key_check=no sslverify=1 "
              "timeout=0 cookie= ssh: host=h port=2222 user=u "
              "path=/img/base.raw verify_host=0");
  /* An ssh URL's parts, decoded but for an IPv6 address and the port. */
  check_name ("ssh://a%20b@[fe80::1%25e]:22/d%20e/base.raw?host_key_check=yes",
              "raw", "ssh://a%20b@[fe80::1%25e]:22/d%20e/base.raw"
              "?host_key_check=yes",
              "ssh://a%20b@[fe80::1%25e]:22/d%20e/base.raw?host_key_check=yes "
              "sslverify=1 timeout=0 cookie= ssh: host=fe80::1%25e port=22 "
              "user=a b path=/d e/base.raw verify_host=1");
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"ssh\","
              "\"host\":\"h\",\"user\":\"u@v\",\"path\":\"/a?b c\"}}",
              NULL, "ssh://u%40v@h/a%3Fb%20c",
              "ssh://u%40v@h/a%3Fb%20c sslverify=1 timeout=0 cookie= ssh: "
              "host=h port= user=u@v path=/a?b c verify_host=1");
  /* JSON's whitespace, escapes and surrogate pairs; -0 is 0. */
  check_name ("json: {\"driver\" :\t\"raw\" ,\r\n\"offset\": -0, \"file\": "
              "{\"driver\":\"file\",\"filename\":\"\\/srv\\/b\\u00e9\\t"
              "\\ud83d\\ude00.raw\"} }\n", NULL, "/srv/b\xc3\xa9\t\xf0\x9f\x98\x80.raw",
              NULL);
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"http\","
              "\"filename\":\"http://web/base.raw\"}}", NULL,
              "http://web/base.raw",
              "http://web/base.raw sslverify=1 timeout=0 cookie=");
  /* Local files. */
  check_name ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"file\","
              "\"filename\":\"/srv/base.raw\"}}", NULL, "/srv/base.raw", NULL);
  check_name ("file:/srv/base.raw", "raw", "/srv/base.raw", NULL);
  /* A colon that is no protocol QEMU names: a local, relative name. */
  check_name ("base:1.raw", "raw", "/dir/base:1.raw", NULL);
}

/* top.qcow2 (local) -> mid_name (in mid_storage) -> base_name,
 * relative to mid (in base_storage), or refused with error.
 */
static void
check_relative (const char *mid_name, const char *mid_storage,
                const char *base_name, const char *base_storage,
                const char *error)
{
  struct memenv *me = memenv_new ();
  struct model base;
  uint8_t *raw = raw_base (&base, 8);
  struct qcow2_image *img;
  struct ib mid, top;

  add_file (me, base_storage, raw, base.size);
  ib_init (&mid, 3, 16, 4 * 65536, false);
  mid.backing = base_name;
  mid.backing_format = "raw";
  mid.model.backing = &base;
  ib_data (&mid, 1, 2);
  ib_finish (&mid);
  add_file (me, mid_storage, mid.buf, mid.len);
  ib_naming (&top, mid_name, "qcow2", 3);
  top.model.backing = &mid.model;
  memenv_clear_errors (me);
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  if (error) {
    CHECKF (img == NULL && errno == EINVAL, "%s -> %s: opened", mid_name,
            base_name);
    CHECKF (strstr (memenv_last_error (me), error), "%s -> %s: message "
            "\"%s\" lacks \"%s\"", mid_name, base_name,
            memenv_last_error (me), error);
  }
  else if (CHECKF (img != NULL, "%s -> %s: %s", mid_name, base_name,
                   memenv_last_error (me))) {
    check_reads (img, &top.model, 0, 4 * 65536, mid_name);
    check_extents (img, &top.model, 0, 4 * 65536, mid_name);
  }
  if (img)
    qcow2_close (img);
  ib_free (&top);
  ib_free (&mid);
  free (raw);
  memenv_free (me);
}

static void
test_relative (void)
{
  check_relative ("http://web:8080/d/mid.qcow2", "http://web:8080/d/mid.qcow2",
                  "base.raw", "http://web:8080/d/base.raw", NULL);
  check_relative ("https://web/d/e/mid.qcow2", "https://web/d/e/mid.qcow2",
                  "../base.raw", "https://web/d/e/../base.raw", NULL);
  check_relative ("ssh://u@h/img/mid.qcow2", "ssh://u@h/img/mid.qcow2",
                  "base.raw", "ssh://u@h/img/base.raw", NULL);
  check_relative ("json:{\"driver\":\"qcow2\",\"file\":{\"driver\":\"http\","
                  "\"url\":\"http://web/d/mid.qcow2\"}}",
                  "http://web/d/mid.qcow2", "sub/base.raw",
                  "http://web/d/sub/base.raw", NULL);
  check_relative ("http://web/d/mid.qcow2", "http://web/d/mid.qcow2",
                  "/abs/base.raw", "/abs/base.raw", NULL);
  check_relative ("nbd+unix:///mid?socket=/tmp/s",
                  "nbd+unix:///mid?socket=/tmp/s", "base.raw",
                  "nbd+unix:///base.raw", "NBD export has no folder");
  check_relative ("ssh://h/img/mid.qcow2?host_key_check=no",
                  "ssh://h/img/mid.qcow2?host_key_check=no", "base.raw",
                  "ssh://h/img/base.raw", "host_key_check set");
}

/* json's raw offset and size: a window of the storage. */
static void
test_raw_window (void)
{
  struct memenv *me = memenv_new ();
  struct model base, win = { .size = 2 * 65536 + 512 };
  uint8_t *raw = raw_base (&base, 9);
  struct qcow2_image *img;
  struct ib top;
  const char *name = "json:{\"driver\":\"raw\",\"offset\":65024,\"size\":"
    "\"131584\",\"file\":{\"driver\":\"nbd\",\"server\":{\"type\":\"unix\","
    "\"path\":\"/s\"}}}";

  add_file (me, "nbd+unix:///?socket=/s", raw, base.size);
  win.raw = raw + 65024;
  ib_naming (&top, name, "raw", 4);
  top.model.backing = &win;
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  if (CHECKF (img != NULL, "raw window: %s", memenv_last_error (me))) {
    check_reads (img, &top.model, 0, 4 * 65536, "raw window");
    qcow2_close (img);
  }
  ib_free (&top);

  /* Past the end of the storage: refused, as QEMU refuses it. */
  ib_naming (&top, "json:{\"driver\":\"raw\",\"offset\":512,\"size\":262144,"
             "\"file\":{\"driver\":\"nbd\",\"path\":\"/s\"}}", "raw", 4);
  memenv_clear_errors (me);
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  CHECK (img == NULL && errno == EINVAL);
  CHECKF (strstr (memenv_last_error (me), "the sum of offset (512) and size "
                  "(262144) is more than the storage's size (262144)"),
          "message: %s", memenv_last_error (me));
  ib_free (&top);
  /* Raw's options on a qcow2 backing file. */
  ib_naming (&top, "json:{\"driver\":\"raw\",\"offset\":512,"
             "\"file\":{\"driver\":\"nbd\",\"path\":\"/s\"}}", "qcow2", 4);
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  CHECK (img == NULL && errno == EINVAL);
  CHECKF (strstr (memenv_last_error (me), "options of the raw format, not "
                  "of qcow2"), "message: %s", memenv_last_error (me));
  ib_free (&top);
  free (raw);
  memenv_free (me);
}

/* A bad name: refused with errno err and phrase in the message. */
static void
check_refused (const char *name, int err, const char *phrase)
{
  struct memenv *me = memenv_new ();
  struct model base;
  uint8_t *raw = raw_base (&base, 10);
  struct qcow2_image *img;
  struct ib top;

  add_file (me, "nbd+unix:///?socket=/s", raw, base.size);
  ib_naming (&top, name, "raw", 5);
  img = open_ib (me, &top, "/dir/top.qcow2", NULL, NULL);
  CHECKF (img == NULL, "%s: opened", name);
  CHECKF (errno == err, "%s: errno %d, expected %d", name, errno, err);
  CHECKF (strstr (memenv_last_error (me), phrase), "%s: message \"%s\" "
          "lacks \"%s\"", name, memenv_last_error (me), phrase);
  CHECKF (memenv_error_count (me) == 1, "%s: %u messages, not one", name,
          memenv_error_count (me));
  if (img)
    qcow2_close (img);
  ib_free (&top);
  free (raw);
  memenv_free (me);
}

/* JSON that json-c reads (or reads its own way) and QEMU refuses, or
 * that is past our bounds: each a clear refusal, never another name.
 */
#define F "\"file\":{\"driver\":\"nbd\",\"path\":\"/s\"}"
static void
check_json_refused (void)
{
  static const struct { const char *name, *phrase; int err; } cases[] = {
    { "json:{\"driver\":\"raw\",\"driver\":\"raw\"," F "}",
      "a key is given twice in one object", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"file\":{\"driver\":\"nbd\"}}",
      "a key is given twice in one object", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"dr\\u0000x\":1}",
      "\\u0000 or half a surrogate pair in a string at \"\\u0000x\"", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\\udc00\"}",
      "half a surrogate pair", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\\ud800\\u0041\"}",
      "half a surrogate pair", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"a\tb\"}",
      "control character 0x09 in a string (escape it) at \"b\"}\"", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\xff\"}", "invalid UTF-8", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\xc0\x80\"}", "invalid UTF-8",
      EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\xed\xa0\x80\"}", "invalid UTF-8",
      EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\xf4\x90\x80\x80\"}",
      "invalid UTF-8", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":\"\xc3\"}", "invalid UTF-8", EINVAL },
    { "json:{\"driver\":\"raw\"," F "} x", "text after the object at \"x\"",
      EINVAL },
    { "json:{\"driver\":\"raw\"," F "}{}", "text after the object", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":NaN}",
      "\"offset\": expected a number", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":-Infinity}", "bad number",
      EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":18446744073709551616}",
      "\"offset\": the number is out of range", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":00}", "bad number at \"00}\"",
      EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":1.}", "bad number", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"offset\":1e3}",
      "must be a non-negative integer, not \"1e3\"", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":{}}", "option \"x\" is not supported",
      ENOTSUP },
    { "json:{\"driver\":\"raw\"," F ",\"backing\":{}}", "only \"backing\": null",
      ENOTSUP },
    { "json:{\"driver\":\"raw\",\"file\":{}}",
      "\"file\" must be the options of the storage", EINVAL },
    { "json:{'driver':\"raw\"," F "}", "single quotes", EINVAL },
    { "json:{\"driver\":'raw'," F "}", "single quotes", EINVAL },
    { "json:{\"driver\":\"raw\"," F " /* c */}", "expected ',' or '}'", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",}", "expected a value at \"}\"", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",1:2}", "expected a key at \"1:2}\"",
      EINVAL },
    { "json:[{\"driver\":\"raw\"," F "}]", "expected an object", EINVAL },
    { "json:{\"driver\":\"raw\"," F ",\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":"
      "{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":{\"x\":1}}}}}}"
      "}}}}}}}}}}}", "objects nest more than 16 deep", EINVAL },
  };

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_refused (cases[i].name, cases[i].err, cases[i].phrase);
}

/* A name past 64 KiB, parsed as a backing= name would be: no header
 * holds one, and a message about one is cut before its reason.
 */
static void
test_json_size (void)
{
  struct name_spec spec;
  char *name, *why;
  int r;

  if (asprintf (&name, "json:{\"driver\":\"raw\"," F ",\"x\":\"%65536s\"}",
                "") < 0)
    abort ();
  r = name_parse (name, &spec, &why);
  CHECK (r == -EINVAL);
  CHECKF (why && strcmp (why, "json: the name is longer than 65536 bytes")
          == 0, "message: %s", why ? why : "(none)");
  if (r == 0)
    name_spec_free (&spec);
  free (why);
  free (name);
}
#undef F

static void
test_refused (void)
{
  check_refused ("gluster://h/v/img", ENOTSUP, "protocol \"gluster\" is not "
                 "supported");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"iscsi\"}}",
                 ENOTSUP, "driver \"iscsi\" is not supported");
  check_refused ("json:{\"driver\":\"raw\",\"file\":\"node0\"}", EINVAL,
                 "names a block node");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s\",\"x-dirty-bitmap\":\"b\"}}", ENOTSUP,
                 "option \"file.x-dirty-bitmap\" is not supported");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s\",\"tls-creds\":\"t\"}}", ENOTSUP,
                 "nbds://");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\"}}",
                 EINVAL, "the nbd driver needs");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":[1]}}", EINVAL, "arrays are not supported");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s\"}", EINVAL, "expected ',' or '}'");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s\"},\"file.path\":\"/t\"}", EINVAL,
                 "\"file.path\" is given twice");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s\"} \"x\":1}", EINVAL, "expected ',' or '}' at "
                 "\"\"x\":1}\"");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"nbd\","
                 "\"path\":\"/s", EINVAL, "unterminated string");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"http\","
                 "\"url\":\"https://web/x\"}}", EINVAL, "not an http:// URL");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"http\","
                 "\"url\":\"http://web/x\",\"password-secret\":\"s\"}}",
                 ENOTSUP, "QEMU secrets");
  check_refused ("json:{\"driver\":\"raw\",\"file\":{\"driver\":\"ssh\","
                 "\"server\":{\"host\":\"h\"},\"path\":\"/x\","
                 "\"host-key-check\":{\"mode\":\"hash\",\"type\":\"md5\","
                 "\"hash\":\"00\"}}}", ENOTSUP, "host key check \"hash\"");
  check_refused ("ssh://h", EINVAL, "not an ssh URL QEMU reads");
  check_refused ("ssh://u@/x", EINVAL, "not an ssh URL QEMU reads");
  check_refused ("ssh://[::1/x", EINVAL, "not an ssh URL QEMU reads");
  check_refused ("ssh://[::1]2/x", EINVAL, "not an ssh URL QEMU reads");
  check_refused ("ssh://h/x?host_key_check=md5:00", ENOTSUP,
                 "only host_key_check=no or yes");
  check_refused ("nbd:nowhere", EINVAL, "not an NBD name QEMU knows");
  /* An IPv6 address in a legacy name: in brackets, as QEMU takes it. */
  check_refused ("nbd:::1:10809", EINVAL, "not an NBD name QEMU knows");
  check_refused ("nbd:fe80::1:10809", EINVAL, "not an NBD name QEMU knows");
  check_refused ("nbd:[::1:10809", EINVAL, "not an NBD name QEMU knows");
  check_refused ("nbd:[::1]10809", EINVAL, "not an NBD name QEMU knows");
  check_json_refused ();
  /* Remote storage that is not there. */
  check_refused ("nbd://h/x", ENOENT, "cannot open backing file "
                 "\"nbd://h/x\"");
}

/* An external data file on remote storage: read-only only. */
static void
test_data_file (void)
{
  struct memenv *me = memenv_new ();
  const uint64_t cs = 65536, size = 4 * cs;
  struct qcow2_options ro = { .readonly = true };
  uint8_t *data = calloc (1, size);
  struct qcow2_image *img;
  struct ib ib;

  ib_init (&ib, 3, 16, size, false);
  ib.incompat |= UINT64_C (1) << 2;
  ib.extra_ext_type = 0x44415441;
  ib.extra_ext_data = "nbd://h/data";
  ib.extra_ext_len = 12;
  for (uint64_t j = 0; j < cs; j++)
    data[cs + j] = model_pattern (false, 5, cs + j);
  ib_set (&ib, 1, UINT64_C (1) << 63 | cs, 0);
  model_set (&ib.model, 1, M_DATA, false, 5, 0, 0);
  ib_finish (&ib);
  add_file (me, "nbd://h/data", data, size);

  img = open_ib (me, &ib, "/d/df.qcow2", NULL, NULL);
  CHECK (img == NULL && errno == EROFS);
  CHECKF (strstr (memenv_last_error (me), "cannot open external data file "
                  "\"nbd://h/data\" for writing: remote storage is only "
                  "read"), "message: %s", memenv_last_error (me));
  img = open_ib (me, &ib, "/d/df.qcow2", &ro, NULL);
  if (CHECKF (img != NULL, "remote data file: %s", memenv_last_error (me))) {
    check_reads (img, &ib.model, 0, size, "remote data file");
    qcow2_close (img);
  }
  ib_free (&ib);
  free (data);
  memenv_free (me);
}

int
main (void)
{
  test_names ();
  test_data_file ();
  test_relative ();
  test_raw_window ();
  test_refused ();
  test_json_size ();
  return unit_finish ();
}
