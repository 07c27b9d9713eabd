/* nbdkit latency filter: being built (issue 5); passes requests through. */

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

static struct nbdkit_filter filter = {
  .name = "latency",
  .longname = "nbdkit latency filter",
};

NBDKIT_REGISTER_FILTER (filter)
