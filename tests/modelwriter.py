# SPDX-License-Identifier: BSD-3-Clause
"""A client writing byte-granular at a VM's pace against a model of its
disk, in a thread of its own, for the control socket's tests:

    w = modelwriter.Writer(handle, model_bytes)
    frozen = w.pause()     # no write in flight, flushed: the disk's data
    w.resume()
    w.finish()             # then w.errors is empty, w.model the disk
    modelwriter.image_data(path, scratch)   # a qcow2 image's data, read
                                            # as a backup reads it (-U)
"""
import random
import subprocess
import threading
import time


def image_data(path, scratch):
    """The guest data of the qcow2 image at path, through scratch (a
    raw file made there), read as a backup of a served image is:
    qemu-img convert -U."""
    subprocess.check_call(["qemu-img", "convert", "-U", "-f", "qcow2",
                           "-O", "raw", path, scratch])
    with open(scratch, "rb") as f:
        return f.read()


class Writer:
    def __init__(self, h, model, seed=1, span=None, writes=0.6, pace=0.005):
        """span: the bytes from the start it writes and reads (default
        all); writes: the share of requests that write; pace: seconds
        between requests."""
        self.model = bytearray(model)
        self.h = h
        self.rand = random.Random(seed)
        self.span = len(self.model) if span is None else span
        self.writes = writes
        self.pace = pace
        self.go = threading.Event()
        self.idle = threading.Event()
        self.stop = False
        self.errors = []
        self.go.set()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def step(self):
        """One request: a write (kept in the model) or a read checked."""
        off = self.rand.randrange(self.span - 70000)
        n = self.rand.randrange(1, 70000)
        if self.rand.random() < self.writes:
            data = bytes([self.rand.randrange(256)]) * n
            self.h.pwrite(data, off)
            self.model[off:off + n] = data
        elif self.h.pread(n, off) != self.model[off:off + n]:
            self.errors.append("the disk differs at %d" % off)
            return False
        return True

    def run(self):
        try:
            while not self.stop:
                if not self.go.is_set():
                    self.idle.set()
                    self.go.wait()
                    continue
                self.idle.clear()
                if not self.step():
                    break
                time.sleep(self.pace)   # a VM's pace, not a flood
        except Exception as e:
            self.errors.append("writer: %s" % e)
        self.idle.set()

    def pause(self):
        """No write in flight: the model is the disk's (flushed)."""
        self.go.clear()
        self.idle.wait()
        self.h.flush()
        return bytes(self.model)

    def resume(self):
        self.go.set()

    def finish(self):
        self.stop = True
        self.go.set()
        self.t.join()
        self.h.flush()
        self.h.shutdown()
