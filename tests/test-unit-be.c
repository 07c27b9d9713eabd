/* SPDX-License-Identifier: BSD-3-Clause */
/* Unit tests of be.h (the only byte order code the engine has) and
 * checked.h (the arithmetic guarding sizes from untrusted images).
 */
#include <stdint.h>
#include <string.h>

#include "be.h"
#include "checked.h"
#include "unit.h"

static void
test_be_byte_order (void)
{
  uint8_t b[10];

  memset (b, 0xaa, sizeof b);
  be16_put (b + 1, 0x1234);
  CHECK (b[0] == 0xaa && b[1] == 0x12 && b[2] == 0x34 && b[3] == 0xaa);

  memset (b, 0xaa, sizeof b);
  be32_put (b + 1, 0x12345678);
  CHECK (b[1] == 0x12 && b[2] == 0x34 && b[3] == 0x56 && b[4] == 0x78);
  CHECK (b[0] == 0xaa && b[5] == 0xaa);

  memset (b, 0xaa, sizeof b);
  be64_put (b + 1, UINT64_C (0x0102030405060708));
  for (int i = 0; i < 8; i++)
    CHECKF (b[1 + i] == i + 1, "be64_put byte %d is %#x", i, b[1 + i]);
  CHECK (b[0] == 0xaa && b[9] == 0xaa);

  /* The QCOW2 magic as it appears in a file. */
  const uint8_t magic[4] = { 'Q', 'F', 'I', 0xfb };
  CHECK_EQ (be32_get (magic), 0x514649fb);
  const uint8_t hi[8] = { 0xff, 0, 0, 0, 0, 0, 0, 0x01 };
  CHECK_EQ (be64_get (hi), UINT64_C (0xff00000000000001));
  const uint8_t h16[2] = { 0x80, 0x01 };
  CHECK_EQ (be16_get (h16), 0x8001);
}

static void
test_be_round_trips (void)
{
  static const uint64_t values[] = {
    0, 1, 0x7f, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xffff, 0x10000,
    0x7fffffff, 0x80000000, 0xffffffff, UINT64_C (0x100000000),
    UINT64_C (0x8000000000000000), UINT64_C (0xfedcba9876543210),
    UINT64_MAX,
  };
  /* Unaligned on purpose: be.h must not assume alignment. */
  uint8_t buf[9 + 8];

  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    uint64_t v = values[i];
    for (size_t off = 0; off < 8; off++) {
      be16_put (buf + off, (uint16_t) v);
      CHECK_EQ (be16_get (buf + off), (uint16_t) v);
      be32_put (buf + off, (uint32_t) v);
      CHECK_EQ (be32_get (buf + off), (uint32_t) v);
      be64_put (buf + off, v);
      CHECK_EQ (be64_get (buf + off), v);
    }
  }
}

static void
test_checked (void)
{
  uint64_t r;

  CHECK (!add_overflow_u64 (1, 2, &r) && r == 3);
  CHECK (!add_overflow_u64 (UINT64_MAX - 1, 1, &r) && r == UINT64_MAX);
  CHECK (add_overflow_u64 (UINT64_MAX, 1, &r));
  CHECK (add_overflow_u64 (UINT64_C (1) << 63, UINT64_C (1) << 63, &r));

  CHECK (!mul_overflow_u64 (1 << 16, 1 << 16, &r) && r == UINT64_C (1) << 32);
  CHECK (!mul_overflow_u64 (UINT64_MAX, 1, &r) && r == UINT64_MAX);
  CHECK (!mul_overflow_u64 (UINT64_MAX, 0, &r) && r == 0);
  CHECK (mul_overflow_u64 (UINT64_C (1) << 32, UINT64_C (1) << 32, &r));
  CHECK (mul_overflow_u64 (UINT64_MAX / 2 + 1, 2, &r));

  /* range_exceeds: [off, off+len) must lie below limit. */
  CHECK (!range_exceeds (0, 0, 0));
  CHECK (!range_exceeds (0, 10, 10));
  CHECK (range_exceeds (1, 10, 10));
  CHECK (!range_exceeds (10, 0, 10));
  CHECK (range_exceeds (11, 0, 10));
  CHECK (range_exceeds (UINT64_MAX, 2, UINT64_MAX));
  CHECK (range_exceeds (2, UINT64_MAX, UINT64_MAX));
  CHECK (!range_exceeds (1, UINT64_MAX - 1, UINT64_MAX));

  CHECK (!is_power_of_2 (0));
  CHECK (is_power_of_2 (1));
  CHECK (is_power_of_2 (2));
  CHECK (!is_power_of_2 (3));
  CHECK (is_power_of_2 (512));
  CHECK (!is_power_of_2 (513));
  CHECK (is_power_of_2 (UINT64_C (1) << 63));
  CHECK (!is_power_of_2 (UINT64_MAX));
  for (unsigned i = 0; i < 64; i++)
    CHECKF (is_power_of_2 (UINT64_C (1) << i), "1 << %u", i);

  CHECK_EQ (div_round_up (0, 512), 0);
  CHECK_EQ (div_round_up (1, 512), 1);
  CHECK_EQ (div_round_up (512, 512), 1);
  CHECK_EQ (div_round_up (513, 512), 2);
  CHECK_EQ (div_round_up (UINT64_MAX, 1), UINT64_MAX);
  CHECK_EQ (div_round_up (UINT64_MAX, 2), UINT64_C (1) << 63);
  CHECK_EQ (div_round_up (UINT64_MAX, UINT64_MAX), 1);

  CHECK_EQ (MIN (3, 5), 3);
  CHECK_EQ (MAX (3, 5), 5);
}

int
main (void)
{
  test_be_byte_order ();
  test_be_round_trips ();
  test_checked ();
  return unit_finish ();
}
