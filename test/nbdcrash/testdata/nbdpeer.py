# nbdpeer: a libnbd client driven through stdin, for quiver's NBD tests.
#
# Usage: python3 nbdpeer.py
#
# It uses libnbd, the NBD project's reference client, and serves one
# connection at a time, so that one process outlives many server restarts.
# Commands, one a line on stdin:
#
#   C <uri>                                connect; prints "R" when the
#                                          handshake is done, "X <message>"
#                                          when it failed
#
# and once connected, each issued at once, with as many requests in flight
# as the driver sends:
#
#   W <id> <offset> <fua 0|1> <hex data>   NBD_CMD_WRITE (with NBD_CMD_FLAG_FUA)
#   F <id>                                 NBD_CMD_FLUSH
#   P <id> <offset> <length> <file>        NBD_CMD_READ, into a new file
#   D                                      disconnect: wait for the requests
#                                          in flight, then print "Z"
#
# For each request it prints exactly one line when the server's reply
# arrives: "A <id>" when the server acknowledged it (a read's data is then
# in its file), "E <id> <message>" when the request failed, was refused, or
# the connection died first. "A" is never printed for a request the server
# did not acknowledge. At the end of stdin it exits.

import faulthandler
import os
import select
import signal

import nbd

# SIGUSR1 prints where the client is, for a test that found it stuck.
faulthandler.register(signal.SIGUSR1)


def say(line):
    os.write(1, (line + "\n").encode())


class Input:
    """Lines from stdin, read without blocking the connection's progress."""

    def __init__(self):
        self.buf = b""
        self.eof = False

    def fill(self):
        chunk = os.read(0, 1 << 20)
        if not chunk:
            self.eof = True
        self.buf += chunk

    def line(self):
        """The next complete line, split into fields, or None."""
        i = self.buf.find(b"\n")
        if i < 0:
            return None
        line, self.buf = self.buf[:i], self.buf[i + 1:]
        return line.decode().split() or ["?"]

    def next(self):
        """Blocks for the next line; None at the end of stdin."""
        while True:
            f = self.line()
            if f is not None or self.eof:
                return f
            self.fill()


def main():
    inp = Input()
    while True:
        f = inp.next()
        if f is None:
            return
        if f[0] != "C" or len(f) != 2:
            say("X expected C <uri>, got %r" % " ".join(f))
            continue
        h = nbd.NBD()
        try:
            h.connect_uri(f[1])
        except nbd.Error as e:
            say("X %s" % e)
            continue
        say("R")
        serve(h, inp)
        say("Z")
        del h


def dead(h):
    return h.aio_is_dead() or h.aio_is_closed()


def serve(h, inp):
    pending = {}  # cookie -> (id, buffer kept alive until the reply, read's file)
    closing = False
    while True:
        while not closing:
            f = inp.line()
            if f is None:
                break
            if f[0] == "D":
                closing = True
            else:
                issue(h, pending, f)
        if inp.eof:
            closing = True
        if closing and not pending:
            break
        rd, wr = [], []
        if not closing:
            rd.append(0)
        alive = not dead(h)
        if alive:
            fd = h.aio_get_fd()
            d = h.aio_get_direction()
            if d & nbd.AIO_DIRECTION_READ:
                rd.append(fd)
            if d & nbd.AIO_DIRECTION_WRITE:
                wr.append(fd)
        if not rd and not wr:
            for ident, _, _ in pending.values():
                say("E %s the connection waits for nothing" % ident)
            return
        r, w, _ = select.select(rd, wr, [])
        if alive:
            try:
                if fd in r:
                    h.aio_notify_read()
                elif fd in w:
                    h.aio_notify_write()
            except nbd.Error:
                pass  # the connection died; its requests are retired below
        retire(h, pending)
        if dead(h):
            for ident, _, _ in pending.values():
                say("E %s connection lost" % ident)
            pending.clear()
        if 0 in r:
            inp.fill()
    if not dead(h):
        try:
            h.shutdown()
        except nbd.Error:
            pass


def retire(h, pending):
    """Reports every request whose reply has arrived."""
    while pending:
        try:
            cookie = h.aio_peek_command_completed()
        except nbd.Error:
            return
        if cookie <= 0:
            return
        ident, buf, path = pending.pop(cookie)
        try:
            h.aio_command_completed(cookie)
        except nbd.Error as e:
            say("E %s %s" % (ident, e))
            continue
        if path:
            with open(path, "wb") as f:
                f.write(buf.to_buffer())
        say("A %s" % ident)


def issue(h, pending, f):
    ident = f[1] if len(f) > 1 else "?"
    path = None
    try:
        if f[0] == "W" and len(f) == 5:
            buf = nbd.Buffer.from_buffer(bytearray.fromhex(f[4]))
            flags = nbd.CMD_FLAG_FUA if f[3] == "1" else 0
            cookie = h.aio_pwrite(buf, int(f[2]), flags=flags)
        elif f[0] == "F" and len(f) == 2:
            buf = None
            cookie = h.aio_flush()
        elif f[0] == "P" and len(f) == 5:
            buf = nbd.Buffer(int(f[3]))
            path = f[4]
            cookie = h.aio_pread(buf, int(f[2]))
        else:
            say("E %s bad command %r" % (ident, " ".join(f)))
            return
    except nbd.Error as e:
        say("E %s %s" % (ident, e))
        return
    pending[cookie] = (ident, buf, path)


main()
