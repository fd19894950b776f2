/* pycni's forwarder: a plugin call to a running `pycni daemon` without starting Python.
 *
 * Built by `pycni install-plugins` (pycni.forwarder) when a C compiler is at hand; the sh front
 * of a daemon-forwarding executable then runs
 *
 *     pycni-forward TYPE SOCKET PYTHON -IS SCRIPT [ARGS...]
 *
 * in place of `PYTHON -IS SCRIPT [ARGS...]`. It does what pycni.shim's forwarding path does,
 * byte for byte on the wire (pycni.daemon.protocol): connect to $PYCNI_SOCKET, else SOCKET,
 * else /run/pycni/pycni.sock; send the plugin type, stdin and the whole environment; relay
 * stdout, stderr and the exit code. Whenever the Python shim would not forward (arguments,
 * no CNI_COMMAND, VERSION, PYCNI_SOCKET=off) or no daemon accepts the connection (nothing
 * has been read or sent yet), it execs the Python command line unchanged, so the result is
 * the Python shim's in every case. The daemon learns the caller's network namespace from the
 * socket's peer credentials: this process runs where the runtime started the plugin.
 *
 * With the forwarder the sh front checks nothing before running it (a node's host may have no
 * Python at all while the daemon's container serves), so when the Python command line cannot be
 * exec'd a runtime's call gets one CNI error JSON here: code 11 (try again) naming the daemon's
 * socket and the interpreter when no daemon accepted the call (kubelet retries; the daemon comes
 * back), else code 50 naming the interpreter, as the front's own check would.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

#define MAGIC "PYCNI1"
#define MAX_FRAME (64u * 1024u * 1024u)

static char **fallback;
static const char *plugin_type;

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* One CNI error on stdout (the spec's error JSON), exit 1. */
static void cni_error(int code, const char *msg, const char *details) {
    printf("{\"code\": %d, \"msg\": ", code);
    json_string(msg);
    printf(", \"details\": ");
    json_string(details);
    printf("}\n");
    fflush(stdout);
    _exit(1);
}

/* The fallback: the Python command line. ``unreached`` is the daemon's socket when no daemon
 * accepted the call (``conn_err`` its connect errno), NULL when the call is not the daemon's
 * (PYCNI_SOCKET=off, arguments, VERSION). */
static void run_python(const char *unreached, int conn_err) {
    execv(fallback[0], fallback);
    int err = errno;
    const char *command = getenv("CNI_COMMAND");
    if (!command || !*command) { /* run by hand: a line for a person */
        fprintf(stderr, "pycni-forward: cannot run %s: %s\n", fallback[0], strerror(err));
        _exit(127);
    }
    char msg[1536], details[1536];
    if (unreached) {
        snprintf(msg, sizeof msg, "pycni plugin %s: no pycni daemon accepts calls on %s (%s) and its Python "
                 "interpreter %s cannot run (%s) for the one-shot fallback", plugin_type, unreached,
                 strerror(conn_err), fallback[0], strerror(err));
        snprintf(details, sizeof details, "try again: the call is served once the pycni daemon (the DaemonSet's "
                 "daemon container, or `pycni daemon`) listens on %s again; or install Python 3.11 or newer at %s "
                 "and run `pycni install-plugins` again for calls without the daemon", unreached, fallback[0]);
        cni_error(11, msg, details);
    }
    snprintf(msg, sizeof msg, "pycni plugin %s: its Python interpreter %s is missing or not executable by this user",
             plugin_type, fallback[0]);
    snprintf(details, sizeof details, "%s; run `pycni install-plugins` again (as root, with the Python that has "
             "pycni installed) to rewrite the plugins", strerror(err));
    cni_error(50, msg, details);
}

/* After the request was (maybe partly) sent: retrying could double an ADD; say so as the shim does. */
static void fail(const char *what, int err) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s; retry, or set PYCNI_SOCKET=off to run without the daemon",
             what, err ? strerror(err) : "malformed reply");
    cni_error(11, "pycni daemon failed while serving the request", msg);
}

struct buf { char *p; size_t n, cap; };

static void put(struct buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) fail("out of memory", ENOMEM);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u32(struct buf *b, uint32_t v) {
    unsigned char x[4] = {v >> 24, v >> 16, v >> 8, v};
    put(b, x, 4);
}

static void put_field(struct buf *b, const void *data, size_t n) {
    put_u32(b, (uint32_t)n);
    put(b, data, n);
}

/* To the daemon with MSG_NOSIGNAL: a daemon that died mid-request must give the error JSON
 * (code 11, as the Python shim answers), not kill this process with SIGPIPE and print nothing. */
static int write_all(int fd, const char *p, size_t n, int sock) {
    while (n) {
        ssize_t w = sock ? send(fd, p, n, MSG_NOSIGNAL) : write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_exact(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? -1 : (errno = 0, -1);
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: pycni-forward TYPE SOCKET PYTHON ARGS...\n");
        return 2;
    }
    const char *type = argv[1], *baked = argv[2];
    plugin_type = type;
    fallback = argv + 3;
    /* The Python shim's own cases: run by hand or with arguments (`dhcp daemon`), VERSION. */
    const char *command = getenv("CNI_COMMAND");
    if (argc > 6 || !command || !*command || !strcmp(command, "VERSION")) run_python(NULL, 0);
    const char *path = getenv("PYCNI_SOCKET");
    if (!path || !*path) path = *baked ? baked : "/run/pycni/pycni.sock";
    if (!strcmp(path, "off")) run_python(NULL, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) run_python(NULL, 0);
    strcpy(addr.sun_path, path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int conn_err = errno;
        if (s >= 0) close(s);
        run_python(path, conn_err); /* no daemon: the plugin runs in Python, stdin untouched */
    }

    struct buf body = {0}, in = {0};
    if (!isatty(0)) {
        char chunk[65536];
        for (;;) {
            ssize_t r = read(0, chunk, sizeof chunk);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            put(&in, chunk, (size_t)r);
        }
    }
    put_u32(&body, 0); /* the frame length, filled in below */
    put(&body, MAGIC, 6);
    put_field(&body, type, strlen(type));
    put_field(&body, in.p ? in.p : "", in.n);
    for (char **e = environ; *e; e++)
        if (strchr(*e, '=')) put_field(&body, *e, strlen(*e));
    uint32_t len = (uint32_t)(body.n - 4);
    unsigned char *hdr = (unsigned char *)body.p;
    hdr[0] = len >> 24, hdr[1] = len >> 16, hdr[2] = len >> 8, hdr[3] = len;
    if (write_all(s, body.p, body.n, 1) < 0) fail("OSError: sending the request", errno);

    unsigned char h[4];
    if (read_exact(s, (char *)h, 4) < 0) fail("ConnectionError: reading the reply", errno);
    uint32_t n = get_u32(h);
    if (n > MAX_FRAME || n < 6) fail("ValueError: reply frame size", 0);
    unsigned char *r = malloc(n);
    if (!r) fail("out of memory", ENOMEM);
    if (read_exact(s, (char *)r, n) < 0) fail("ConnectionError: reading the reply", errno);
    close(s);
    if (memcmp(r, MAGIC, 6)) fail("ValueError: not a pycni daemon frame", 0);
    const unsigned char *f[3];
    uint32_t fl[3];
    size_t i = 6;
    for (int k = 0; k < 3; k++) {
        if (i + 4 > n) fail("ValueError: truncated reply", 0);
        fl[k] = get_u32(r + i);
        i += 4;
        if (fl[k] > n - i) fail("ValueError: truncated reply", 0);
        f[k] = r + i;
        i += fl[k];
    }
    if (i != n || fl[0] == 0 || fl[0] > 11) fail("ValueError: malformed reply", 0);
    char code[12];
    memcpy(code, f[0], fl[0]);
    code[fl[0]] = 0;
    char *end;
    long status = strtol(code, &end, 10);
    if (*end) fail("ValueError: malformed exit code", 0);
    if (fl[1]) write_all(1, (const char *)f[1], fl[1], 0);
    if (fl[2]) write_all(2, (const char *)f[2], fl[2], 0);
    return (int)(status & 0xff);
}
