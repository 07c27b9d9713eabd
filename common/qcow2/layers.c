/* SPDX-License-Identifier: BSD-3-Clause */
/* Backing layers shared by the images of one table (qcow2_layers_new):
 * a layer several open images stand on is opened once, found by its
 * identity (env's, or a remote layer's URL), and freed by whoever
 * drops its last user.  The table also knows the images open for
 * writing, so that a layer is never at once a backing file read by
 * some and an image written by another.
 *
 * Images opened together (a fleet's clients connecting at once) would
 * each open a layer none of them has opened yet: a remote base's
 * connections and metadata reads made once per image, not once.  So
 * the first marks the layer as being opened, and the others wait for
 * it; only a top image's first backing file waits (its opener holds
 * no layer being opened), so that two chains naming each other's
 * layers cannot wait for each other.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "lock.h"

/* One layer shared, or (layer NULL) a layer being opened (opening) or
 * an image open for writing.
 */
struct layers_entry {
  struct layers_entry *next;
  char *id;
  /* How the layer was opened: the format asked (NULL: probed), and
   * whether its own backing file was left out (json's "backing": null).
   */
  char *format;
  bool no_backing;
  bool opening;
  struct qcow2_image *layer;
};

struct qcow2_layers {
  struct lock lock;             /* guards entries, and each layer's users */
  struct layers_entry *entries;
  pthread_cond_t opened;        /* a layer being opened is, or is not */
  unsigned abandoned;           /* openings given up so far */
  /* The layers' environment: the caller's, kept as long as the table
   * (a layer outlives the image that opened it).
   */
  struct qcow2_env env;
};

struct qcow2_layers *
qcow2_layers_new (const struct qcow2_env *env)
{
  struct qcow2_layers *t = calloc (1, sizeof *t);

  if (!t)
    return NULL;
  lock_init (&t->lock);
  lock_cond_init (&t->opened);
  t->env = *env;
  t->env.layers = t;
  return t;
}

void
qcow2_layers_free (struct qcow2_layers *t)
{
  if (!t)
    return;
  assert (!t->entries);         /* every image closed first */
  pthread_cond_destroy (&t->opened);
  lock_destroy (&t->lock);
  free (t);
}

const struct qcow2_env *
layers_env (const struct qcow2_env *env)
{
  return env->layers ? &env->layers->env : env;
}

/* The entry of id (a layer opened so, or being opened, or a writer),
 * or NULL.
 */
static struct layers_entry *
layers_lookup (struct qcow2_layers *t, const char *id, const char *format,
               bool no_backing, bool *writer)
  TSA_REQUIRES (&t->lock)
{
  *writer = false;
  for (struct layers_entry *e = t->entries; e; e = e->next) {
    if (strcmp (e->id, id) != 0)
      continue;
    if (!e->layer && !e->opening) {
      *writer = true;
      return e;
    }
    if (e->no_backing == no_backing &&
        (format ? e->format && strcmp (format, e->format) == 0 : !e->format))
      return e;
  }
  return NULL;
}

/* A new entry at the head of the table, or NULL. */
static struct layers_entry *
layers_insert (struct qcow2_layers *t, const char *id, const char *format,
               struct qcow2_image *layer, bool no_backing)
  TSA_REQUIRES (&t->lock)
{
  struct layers_entry *e = calloc (1, sizeof *e);

  if (!e || !(e->id = strdup (id)) ||
      (format && !(e->format = strdup (format)))) {
    if (e)
      free (e->id);
    free (e);
    return NULL;
  }
  e->no_backing = no_backing;
  e->layer = layer;
  e->next = t->entries;
  t->entries = e;
  return e;
}

int
layers_find (struct qcow2_layers *t, const char *id, const char *format,
             bool no_backing, bool wait, struct qcow2_image **layer)
{
  struct layers_entry *e;
  bool writer;
  int r = 0;

  *layer = NULL;
  lock_acquire (&t->lock);
  for (unsigned abandoned = t->abandoned;;) {
    e = layers_lookup (t, id, format, no_backing, &writer);
    if (writer)
      r = -EBUSY;
    else if (e && e->layer) {
      layers_hold (e->layer);
      *layer = e->layer;
    }
    else if (e && wait && t->abandoned == abandoned) {
      lock_wait (&t->lock, &t->opened);
      continue;
    }
    /* Opened by the caller, the others waiting; unless another is
     * opening it (the caller cannot wait) or an opening it waited for
     * failed: then each opens its own, as if none waited (and so out
     * of memory).
     */
    else if (!e && wait && t->abandoned == abandoned &&
             (e = layers_insert (t, id, format, NULL, no_backing))) {
      e->opening = true;
      r = 1;
    }
    break;
  }
  lock_release (&t->lock);
  return r;
}

static void
layers_remove (struct qcow2_layers *t, struct layers_entry *e)
  TSA_REQUIRES (&t->lock)
{
  struct layers_entry **p = &t->entries;

  while (*p != e)
    p = &(*p)->next;
  *p = e->next;
  free (e->id);
  free (e->format);
  free (e);
}

int
layers_add (struct qcow2_layers *t, const char *format, bool no_backing,
            struct qcow2_image **layer)
{
  struct qcow2_image *l = *layer;
  struct layers_entry *e;
  bool writer;
  int r = 0;

  lock_acquire (&t->lock);
  e = layers_lookup (t, l->id, format, no_backing, &writer);
  if (writer)
    r = -EBUSY;
  else if (e && e->opening) {
    /* Being opened (by the caller, or by another who will find this
     * one): the waiting images get it.
     */
    e->opening = false;
    e->layer = l;
    l->shared = t;
    pthread_cond_broadcast (&t->opened);
  }
  else if (e) {
    /* Opened by another meanwhile: that one is used. */
    layers_hold (e->layer);
    *layer = e->layer;
    r = 1;
  }
  else if (layers_insert (t, l->id, format, l, no_backing))
    l->shared = t;
  else
    r = -ENOMEM;
  lock_release (&t->lock);
  return r;
}

void
layers_abandon (struct qcow2_layers *t, const char *id, const char *format,
                bool no_backing)
{
  struct layers_entry *e;
  bool writer;

  lock_acquire (&t->lock);
  e = layers_lookup (t, id, format, no_backing, &writer);
  if (e && e->opening) {
    layers_remove (t, e);
    t->abandoned++;
    pthread_cond_broadcast (&t->opened);
  }
  lock_release (&t->lock);
}

void
layers_hold (struct qcow2_image *layer)
{
  __atomic_add_fetch (&layer->users, 1, __ATOMIC_RELAXED);
}

bool
layers_release (struct qcow2_image *layer)
{
  struct qcow2_layers *t = layer->shared;
  bool last;

  if (!t)
    return __atomic_sub_fetch (&layer->users, 1, __ATOMIC_ACQ_REL) == 0;
  /* Under the lock: a layer found is never one being freed. */
  lock_acquire (&t->lock);
  last = __atomic_sub_fetch (&layer->users, 1, __ATOMIC_ACQ_REL) == 0;
  if (last)
    for (struct layers_entry *e = t->entries; e; e = e->next)
      if (e->layer == layer) {
        layers_remove (t, e);
        break;
      }
  lock_release (&t->lock);
  return last;
}

bool
qcow2_layers_has (struct qcow2_layers *t, const char *id)
  TSA_EXCLUDES (&t->lock)
{
  bool has = false;

  lock_acquire (&t->lock);
  for (struct layers_entry *e = t->entries; e && !has; e = e->next)
    has = (e->layer || e->opening) && strcmp (e->id, id) == 0;
  lock_release (&t->lock);
  return has;
}

int
layers_claim (struct qcow2_layers *t, const char *id)
{
  int r = 0;

  lock_acquire (&t->lock);
  for (struct layers_entry *e = t->entries; e; e = e->next)
    if (strcmp (e->id, id) == 0)
      r = -EBUSY;
  if (r == 0 && !layers_insert (t, id, NULL, NULL, false))
    r = -ENOMEM;
  lock_release (&t->lock);
  return r;
}

void
layers_unclaim (struct qcow2_layers *t, const char *id)
{
  lock_acquire (&t->lock);
  for (struct layers_entry *e = t->entries; e; e = e->next)
    if (!e->layer && !e->opening && strcmp (e->id, id) == 0) {
      layers_remove (t, e);
      break;
    }
  lock_release (&t->lock);
}

int
layers_write_begin (struct qcow2_image *layer, bool *shared)
{
  struct qcow2_layers *t = layer->shared;
  int r = 0;

  *shared = t != NULL;
  if (!t) {
    /* Its image's own (no table, or a layer the table cannot share):
     * the table, if any, must still refuse its file to the others.
     */
    t = layer->env->layers;
    if (__atomic_load_n (&layer->users, __ATOMIC_ACQUIRE) > 1)
      return -EBUSY;
    if (t && (r = layers_claim (t, layer->id)) == 0)
      layer->claimed = true;
    return r;
  }
  lock_acquire (&t->lock);
  if (__atomic_load_n (&layer->users, __ATOMIC_ACQUIRE) > 1)
    r = -EBUSY;
  else {
    /* Its entry becomes a writer's: found by no image, removed when the
     * layer is freed (image_free unclaims it).
     */
    for (struct layers_entry *e = t->entries; e; e = e->next)
      if (e->layer == layer) {
        e->layer = NULL;
        break;
      }
    layer->shared = NULL;
    layer->claimed = true;
  }
  lock_release (&t->lock);
  return r;
}

void
layers_write_end (struct qcow2_image *layer, bool shared)
{
  struct qcow2_layers *t = layer->env->layers;

  if (!t || !layer->claimed)
    return;
  if (!shared) {
    layers_unclaim (t, layer->id);
    layer->claimed = false;
    return;
  }
  lock_acquire (&t->lock);
  for (struct layers_entry *e = t->entries; e; e = e->next)
    if (!e->layer && !e->opening && strcmp (e->id, layer->id) == 0) {
      e->layer = layer;
      break;
    }
  layer->shared = t;
  layer->claimed = false;
  lock_release (&t->lock);
}
