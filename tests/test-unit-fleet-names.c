/* SPDX-License-Identifier: BSD-3-Clause */
/* dir='s name rules (plugins/qcow2/fleet-names.c): which export names
 * are refused and why, which template= makes images of, and how a
 * message shows a name (escaped, cut): hostile names among them.
 */
#include <stdbool.h>
#include <string.h>

#include "fleet.h"
#include "unit.h"

static void
check_refusals (void)
{
  static const struct {
    const char *name;
    const char *why;            /* NULL: accepted */
  } cases[] = {
    { "vm1.qcow2", NULL },
    { "VM-1_a.b", NULL },
    { "d\xc3\xa9j\xc3\xa0.qcow2", NULL },       /* UTF-8 */
    { "\xf0\x9f\x92\xbe", NULL },               /* U+1F4BE */
    { "", NULL },               /* the empty name: plugin_open's own */
    { ".hidden", "it starts with '.'" },
    { ".new-abcdef", "it starts with '.'" },
    { "..", "it starts with '.'" },
    { "a/b", "it holds a '/'" },
    { "/etc/passwd", "it holds a '/'" },
    { "x..y", "it holds \"..\"" },
    { "a\tb", "it holds a control byte" },
    { "a\nnbdkit: error: forged", "it holds a control byte" },
    { "del\x7f", "it holds a control byte" },
    { "\xff\xfe", "it is not UTF-8 (as NBD's export names are)" },
    { "\xc0\xaf", "it is not UTF-8 (as NBD's export names are)" },
    { "\xed\xa0\x80", "it is not UTF-8 (as NBD's export names are)" },
    { "\xf4\x90\x80\x80", "it is not UTF-8 (as NBD's export names are)" },
    { "a\xc3", "it is not UTF-8 (as NBD's export names are)" },
  };
  char long_name[300];

  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *got = fleet_name_refusal (cases[i].name);

    CHECKF (cases[i].why ? got && strcmp (got, cases[i].why) == 0 : !got,
            "case %zu: got %s", i, got ? got : "(accepted)");
  }
  memset (long_name, 'a', 255);
  long_name[255] = '\0';
  CHECK (fleet_name_refusal (long_name) == NULL);
  long_name[255] = 'a';
  long_name[256] = '\0';
  CHECK (strcmp (fleet_name_refusal (long_name),
                 "it is longer than 255 bytes") == 0);
}

static void
check_creatable (void)
{
  CHECK (fleet_creatable ("vm1.qcow2"));
  CHECK (fleet_creatable ("A-b_c.9"));
  CHECK (!fleet_creatable (""));
  CHECK (!fleet_creatable ("-vm"));
  CHECK (!fleet_creatable ("_vm"));
  CHECK (!fleet_creatable (".vm"));
  CHECK (!fleet_creatable ("vm 1"));
  CHECK (!fleet_creatable ("d\xc3\xa9j\xc3\xa0"));
  CHECK (!fleet_creatable ("a:b"));
  CHECK (!fleet_creatable ("A...x"));   /* found by fuzz-exports */
}

static void
check_shown (void)
{
  char buf[FLEET_SHOWN_MAX], hostile[256];

  CHECK (strcmp (fleet_shown ("vm1.qcow2", buf), "vm1.qcow2") == 0);
  CHECK (strcmp (fleet_shown ("a\tb\n", buf), "a\\x09b\\x0a") == 0);
  CHECK (strcmp (fleet_shown ("d\xc3\xa9", buf), "d\\xc3\\xa9") == 0);
  CHECK (strcmp (fleet_shown ("back\\slash", buf), "back\\x5cslash") == 0);
  CHECK (strcmp (fleet_shown ("\x1b[31mred", buf), "\\x1b[31mred") == 0);
  /* Cut at 64 bytes, the worst case fitting the buffer. */
  memset (hostile, 0x01, 255);
  hostile[255] = '\0';
  fleet_shown (hostile, buf);
  CHECK_INT (strlen (buf), 64 * 4 + 3);
  CHECK (strcmp (buf + 64 * 4, "...") == 0);
  for (size_t i = 0; buf[i]; i++)
    CHECKF (buf[i] >= 0x20 && buf[i] < 0x7f, "byte %zu shown raw", i);
}

int
main (void)
{
  check_refusals ();
  check_creatable ();
  check_shown ();
  return unit_finish ();
}
