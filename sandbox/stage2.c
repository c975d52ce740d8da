/*
 * sbx-stage2: the first program that runs inside the sandbox, between bwrap and the
 * user's command (inside bwrap's namespaces, or directly as the child on weaker tiers).
 *
 *     sbx-stage2 CONFIG_FD KEEP
 *
 * CONFIG_FD holds the encoded configuration (sandbox/stage2_wire.py is its one
 * definition); KEEP is the comma-separated, strictly ascending list of descriptors to
 * pass on to the command. Stage 2 receives data, never code: the Landlock rules and the
 * seccomp BPF were computed by the Python side, and this program only installs them, in
 * the order main() reads top to bottom:
 *
 *     fd hygiene -> config -> preserved fds -> chdir -> network bridge -> supervisor
 *         -> rlimits -> no_new_privs -> Landlock -> seccomp -> exec
 *
 * Every failure after the config is read is one 'E' record on the status fd, naming the
 * layer, the errno and the exit status; nothing is printed. The status fd is close-on-exec,
 * so a successful exec closes it with nothing more said.
 *
 * Build: cc -O2 -Wall -Wextra -Werror -std=gnu11 -o sbx-stage2 sandbox/stage2.c
 * Tests add -DSBX_STAGE2_FAULTS, which lets a config record make one step fail with EPERM.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <linux/filter.h>
#include <linux/seccomp.h>

/* glibc 2.36 and older kernel headers lack some of these; the numbers are the same on
 * x86_64 and aarch64 (both use the generic table for syscalls added after 2019). */
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef PR_SET_NO_NEW_PRIVS
#define PR_SET_NO_NEW_PRIVS 38
#endif

/* Our own Landlock definitions rather than <linux/landlock.h>: the installed header
 * predates the scoped field, and the kernel accepts this larger struct from an older
 * caller's point of view as long as the fields it does not know are zero. */
#define SBX_LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#define SBX_LANDLOCK_RULE_PATH_BENEATH 1

struct sbx_landlock_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct sbx_landlock_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define EXIT_SETUP_FAILED 125
#define EXIT_NOT_EXECUTABLE 126
#define EXIT_NOT_FOUND 127

#define FIRST_INHERITED_FD 3
#define FALLBACK_WALK_CAP (1 << 20) /* the kernel's default fs.nr_open ceiling */
#define DEFAULT_SEARCH_PATH "/usr/local/bin:/usr/bin:/bin"

/* A status record stays within PIPE_BUF so one write() delivers it whole. */
#define RECORD_MAX 4096
#define DETAIL_MAX 3800

/* Config record tags (stage2_wire.py has the same table). */
enum {
    TAG_STATUS_FD = 1,
    TAG_CWD = 2,
    TAG_ARGV = 3,
    TAG_ENV = 4,
    TAG_SEARCH_PATH = 5,
    TAG_RLIMIT = 6,
    TAG_LANDLOCK = 7,
    TAG_LANDLOCK_RULE = 8,
    TAG_SECCOMP_FD = 9,
    TAG_EXE_FD = 10,
    TAG_PROXY_LISTEN = 11,
    TAG_SUPERVISE = 12,
    TAG_FAULT = 0x7F,
};

#define CONFIG_MAGIC "SBX2"
#define CONFIG_VERSION 1
#define CONFIG_HEADER_SIZE 8
#define RECORD_HEADER_SIZE 6


/* ---- fault injection (test builds only) ------------------------------------------- */

#ifdef SBX_STAGE2_FAULTS
static const char *const fault_steps[] = {
    "close_range", "preserved-fd", "chdir", "network-bridge", "supervisor", "rlimits", "no_new_privs", "landlock", "seccomp", "exec",
};
static const char *injected_fault;

static int
fault_at(const char *step)
{
    return injected_fault != NULL && strcmp(injected_fault, step) == 0;
}

/* The call is not made at all: the step sees exactly what a kernel refusal looks like. */
#define FAULTABLE(step, call) (fault_at(step) ? (errno = EPERM, -1L) : (long)(call))
#else
#define FAULTABLE(step, call) (call)
#endif


/* ---- text building without stdio ------------------------------------------------------ */

/* A bounded string; what does not fit is cut, never overflows. */
struct text {
    char data[DETAIL_MAX + 1];
    size_t len;
};

static void
text_add_bytes(struct text *t, const char *s, size_t n)
{
    size_t room = DETAIL_MAX - t->len;
    if (n > room)
        n = room;
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void
text_add(struct text *t, const char *s)
{
    text_add_bytes(t, s, strlen(s));
}

static void
text_add_u64(struct text *t, uint64_t value)
{
    char digits[24];
    size_t i = sizeof digits;
    do {
        digits[--i] = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    text_add_bytes(t, digits + i, sizeof digits - i);
}

static void
text_add_i64(struct text *t, int64_t value)
{
    if (value < 0) {
        text_add(t, "-");
        text_add_u64(t, (uint64_t)0 - (uint64_t)value);
    } else {
        text_add_u64(t, (uint64_t)value);
    }
}


/* ---- failures and the status channel ---------------------------------------------------- */

struct failure {
    const char *layer;
    int err;
    int exit_status;
    struct text detail;
};

/* Record a failure; always returns -1 so a step can `return fail(...)`. The detail is
 * started here and may be extended by the caller through f->detail. */
static int
fail(struct failure *f, const char *layer, int err, const char *detail)
{
    f->layer = layer;
    f->err = err;
    f->exit_status = EXIT_SETUP_FAILED;
    f->detail.len = 0;
    f->detail.data[0] = '\0';
    text_add(&f->detail, detail);
    return -1;
}

static void
put_u32(unsigned char *p, uint32_t value)
{
    p[0] = (unsigned char)value;
    p[1] = (unsigned char)(value >> 8);
    p[2] = (unsigned char)(value >> 16);
    p[3] = (unsigned char)(value >> 24);
}

/* One frame: kind, u32 little-endian payload length, payload. Errors are ignored: the
 * parent has gone away, and nobody is left to tell. */
static void
write_record(int status_fd, char kind, const char *payload, size_t len)
{
    unsigned char frame[RECORD_MAX];
    size_t total, done = 0;

    if (len > sizeof frame - 5)
        len = sizeof frame - 5;
    frame[0] = (unsigned char)kind;
    put_u32(frame + 1, (uint32_t)len);
    memcpy(frame + 5, payload, len);
    total = 5 + len;
    while (done < total) {
        /* Safe here: a write to the pipe the parent handed us for exactly this. */
        ssize_t n = write(status_fd, frame + done, total - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        done += (size_t)n;
    }
}

/* Append a field and its NUL separator; the payload fits RECORD_MAX by construction. */
static size_t
add_field(char *payload, size_t at, const char *s, size_t n, int terminate)
{
    memcpy(payload + at, s, n);
    at += n;
    if (terminate)
        payload[at++] = '\0';
    return at;
}

static void
report_started(int status_fd)
{
    write_record(status_fd, 'S', "", 0);
}

static void
report_note(int status_fd, const char *layer, const char *message)
{
    char payload[RECORD_MAX];
    size_t len = add_field(payload, 0, layer, strlen(layer), 1);
    size_t n = strlen(message);
    if (n > DETAIL_MAX)
        n = DETAIL_MAX;
    len = add_field(payload, len, message, n, 0);
    write_record(status_fd, 'N', payload, len);
}

static void
report_error(int status_fd, const struct failure *f)
{
    char payload[RECORD_MAX];
    struct text number;
    size_t len = add_field(payload, 0, f->layer, strlen(f->layer), 1);

    len = add_field(payload, len, f->detail.data, f->detail.len, 1);
    number.len = 0;
    text_add_i64(&number, f->err);
    len = add_field(payload, len, number.data, number.len, 1);
    number.len = 0;
    text_add_i64(&number, f->exit_status);
    len = add_field(payload, len, number.data, number.len, 0);
    write_record(status_fd, 'E', payload, len);
}


/* ---- command line ---------------------------------------------------------------------- */

struct keep_list {
    int *fds;
    size_t n;
};

/* A descriptor number: decimal digits only, no sign, at most INT_MAX. */
static int
parse_fd_number(const char *s, size_t n, int *out)
{
    long value = 0;
    size_t i;

    if (n == 0 || n > 10)
        return -1;
    for (i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        value = value * 10 + (s[i] - '0');
    }
    if (value > INT_MAX)
        return -1;
    *out = (int)value;
    return 0;
}

static int
parse_keep_list(const char *s, struct keep_list *keep)
{
    size_t count = 1;
    const char *p;

    keep->fds = NULL;
    keep->n = 0;
    if (*s == '\0')
        return 0;
    for (p = s; *p; p++)
        count += (*p == ',');
    keep->fds = malloc(count * sizeof *keep->fds);
    if (keep->fds == NULL)
        return -1;
    for (p = s;;) {
        const char *end = strchrnul(p, ',');
        int fd;
        if (parse_fd_number(p, (size_t)(end - p), &fd) < 0 || fd < FIRST_INHERITED_FD)
            return -1;
        /* Strictly ascending: the gaps between kept fds are then simply computed. */
        if (keep->n > 0 && fd <= keep->fds[keep->n - 1])
            return -1;
        keep->fds[keep->n++] = fd;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

static void __attribute__((noreturn))
usage(void)
{
    static const char message[] =
        "sbx-stage2: usage: sbx-stage2 CONFIG_FD KEEP "
        "(KEEP: comma-separated, strictly ascending descriptor numbers >= 3, or empty)\n";
    /* Safe here: the status fd is not known yet, so stderr is the only channel. */
    ssize_t ignored = write(STDERR_FILENO, message, sizeof message - 1);
    (void)ignored;
    _exit(EXIT_SETUP_FAILED);
}

static int
parse_arguments(int argc, char **argv, int *config_fd, struct keep_list *keep)
{
    if (argc != 3)
        return -1;
    if (parse_fd_number(argv[1], strlen(argv[1]), config_fd) < 0)
        return -1;
    return parse_keep_list(argv[2], keep);
}


/* ---- fd hygiene ------------------------------------------------------------------------ */

enum hygiene { HYGIENE_CLOSE_RANGE, HYGIENE_WALKED };

static int
sbx_close_range(unsigned int first, unsigned int last, unsigned int flags)
{
#ifdef SBX_STAGE2_FAULTS
    if (fault_at("close_range")) {
        errno = ENOSYS; /* what a kernel before 5.11 answers */
        return -1;
    }
#endif
    /* Safe here: CLOSE_RANGE_CLOEXEC only sets a flag; nothing is closed before exec. */
    return (int)syscall(SYS_close_range, first, last, flags);
}

/* The walk for kernels without close_range: every number up to the larger finite
 * RLIMIT_NOFILE bound, through fcntl only. Never /proc: it may be absent or hidden. */
static void
walk_fds_cloexec(const struct keep_list *keep)
{
    struct rlimit lim;
    rlim_t bound = FALLBACK_WALK_CAP;
    size_t next_keep = 0;
    int fd;

    if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        rlim_t finite = 0;
        if (lim.rlim_cur != RLIM_INFINITY)
            finite = lim.rlim_cur;
        if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max > finite)
            finite = lim.rlim_max;
        if (finite != 0 && finite < bound)
            bound = finite;
    }
    for (fd = FIRST_INHERITED_FD; (rlim_t)fd < bound; fd++) {
        int flags;
        if (next_keep < keep->n && keep->fds[next_keep] == fd) {
            next_keep++;
            continue;
        }
        /* Safe here: F_GETFD/F_SETFD only read and set the close-on-exec flag. */
        flags = fcntl(fd, F_GETFD);
        if (flags >= 0 && !(flags & FD_CLOEXEC))
            fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
}

/* Mark every descriptor >= 3 that is not kept close-on-exec. Landlock cannot stop a
 * descriptor opened before its ruleset existed, so this is the only thing between a
 * descriptor the caller leaked and the command; hence it runs before anything else. */
static enum hygiene
mark_inherited_fds_cloexec(const struct keep_list *keep)
{
    unsigned int low = FIRST_INHERITED_FD;
    size_t i;

    for (i = 0; i < keep->n; i++) {
        unsigned int fd = (unsigned int)keep->fds[i];
        if (fd > low && sbx_close_range(low, fd - 1, CLOSE_RANGE_CLOEXEC) < 0)
            goto walk;
        low = fd + 1;
    }
    if (sbx_close_range(low, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        goto walk;
    return HYGIENE_CLOSE_RANGE;

walk:
    walk_fds_cloexec(keep);
    return HYGIENE_WALKED;
}


/* ---- reading a descriptor whole ---------------------------------------------------------- */

/* Read fd from offset 0 to EOF (pread: the memfd's offset is shared with the parent).
 * A pipe cannot pread; it is read from where it stands. */
static int
read_whole_fd(int fd, unsigned char **out, size_t *out_len)
{
    size_t cap = 4096, len = 0;
    unsigned char *buf = malloc(cap);
    int seekable = 1;

    if (buf == NULL)
        return -1;
    for (;;) {
        ssize_t n;
        if (len == cap) {
            unsigned char *bigger = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (bigger == NULL) {
                free(buf);
                errno = ENOMEM;
                return -1;
            }
            buf = bigger;
            cap *= 2;
        }
        /* Safe here: reading a descriptor the parent created for us. */
        n = seekable ? pread(fd, buf + len, cap - len, (off_t)len) : read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == ESPIPE && seekable && len == 0) {
            seekable = 0;
            continue;
        }
        if (n < 0) {
            int saved = errno;
            free(buf);
            errno = saved;
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    *out = buf;
    *out_len = len;
    return 0;
}


/* ---- the config -------------------------------------------------------------------------- */

struct rlimit_request {
    int resource;
    int64_t soft, hard; /* -1: infinity */
};

struct landlock_rule {
    uint64_t access;
    int optional;
    char *path;
};

struct config {
    int status_fd; /* -1 until the first record is read */
    char *cwd;
    char **argv;
    char **envp;
    char *search_path;
    struct rlimit_request *rlimits;
    size_t n_rlimits;
    int has_landlock;
    uint32_t landlock_abi;
    uint64_t handled_fs, handled_net, scoped, file_rights;
    struct landlock_rule *rules;
    size_t n_rules;
    int seccomp_fd;
    int exe_fd;
    int proxy_channel_fd; /* -1: no network bridge */
    uint16_t proxy_port;
    int supervise; /* fork a supervisor that outlives the command and kills what it leaves */
    char *fault;
};

static uint16_t
get_u16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t
get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t
get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static int
config_error(struct failure *f, const char *what, unsigned int tag)
{
    fail(f, "config", EINVAL, what);
    text_add(&f->detail, " (record tag ");
    text_add_u64(&f->detail, tag);
    text_add(&f->detail, ")");
    return -1;
}

static int
out_of_memory(struct failure *f)
{
    return fail(f, "config", ENOMEM, "out of memory reading the config");
}

static int
expect_length(struct failure *f, unsigned int tag, uint32_t len, uint32_t expected)
{
    if (len == expected)
        return 0;
    fail(f, "config", EINVAL, "record has length ");
    text_add_u64(&f->detail, len);
    text_add(&f->detail, ", expected ");
    text_add_u64(&f->detail, expected);
    text_add(&f->detail, " (record tag ");
    text_add_u64(&f->detail, tag);
    text_add(&f->detail, ")");
    return -1;
}

static int
parse_fd_payload(struct failure *f, unsigned int tag, const unsigned char *p, uint32_t len, int *out)
{
    int32_t value;
    if (expect_length(f, tag, len, 4) < 0)
        return -1;
    value = (int32_t)get_u32(p);
    if (value < 0)
        return config_error(f, "negative file descriptor", tag);
    *out = value;
    return 0;
}

/* A byte string with no NUL inside, copied and terminated. */
static int
parse_bytes(struct failure *f, unsigned int tag, const unsigned char *p, uint32_t len, int allow_empty,
            char **out)
{
    char *copy;
    if (len == 0 && !allow_empty)
        return config_error(f, "empty string", tag);
    if (memchr(p, '\0', len) != NULL)
        return config_error(f, "string with an embedded NUL byte", tag);
    copy = malloc((size_t)len + 1);
    if (copy == NULL)
        return out_of_memory(f);
    memcpy(copy, p, len);
    copy[len] = '\0';
    *out = copy;
    return 0;
}

/* NUL-terminated strings back to back. They point into the config buffer, which lives
 * until exec. */
static int
parse_string_list(struct failure *f, unsigned int tag, unsigned char *p, uint32_t len, char ***out)
{
    size_t count = 0, i = 0;
    uint32_t at;
    char **list;

    if (len > 0 && p[len - 1] != '\0')
        return config_error(f, "string list not NUL-terminated", tag);
    for (at = 0; at < len; at++)
        count += (p[at] == '\0');
    list = malloc((count + 1) * sizeof *list);
    if (list == NULL)
        return out_of_memory(f);
    for (at = 0; at < len; at += (uint32_t)strlen((char *)p + at) + 1)
        list[i++] = (char *)p + at;
    list[i] = NULL;
    *out = list;
    return 0;
}

static int
check_environment(struct failure *f, char **envp)
{
    for (; *envp != NULL; envp++) {
        const char *equals = strchr(*envp, '=');
        if (equals == NULL || equals == *envp)
            return config_error(f, "environment entry is not NAME=VALUE", TAG_ENV);
    }
    return 0;
}

static int
parse_rlimit(struct failure *f, const unsigned char *p, uint32_t len, struct config *cfg)
{
    struct rlimit_request *grown, *r;
    if (expect_length(f, TAG_RLIMIT, len, 20) < 0)
        return -1;
    grown = realloc(cfg->rlimits, (cfg->n_rlimits + 1) * sizeof *grown);
    if (grown == NULL)
        return out_of_memory(f);
    cfg->rlimits = grown;
    r = &grown[cfg->n_rlimits++];
    r->resource = (int32_t)get_u32(p);
    r->soft = (int64_t)get_u64(p + 4);
    r->hard = (int64_t)get_u64(p + 12);
    if (r->soft < -1 || r->hard < -1)
        return config_error(f, "rlimit value below -1", TAG_RLIMIT);
    return 0;
}

static int
parse_landlock(struct failure *f, const unsigned char *p, uint32_t len, struct config *cfg)
{
    if (expect_length(f, TAG_LANDLOCK, len, 36) < 0)
        return -1;
    cfg->has_landlock = 1;
    cfg->landlock_abi = get_u32(p);
    cfg->handled_fs = get_u64(p + 4);
    cfg->handled_net = get_u64(p + 12);
    cfg->scoped = get_u64(p + 20);
    cfg->file_rights = get_u64(p + 28);
    return 0;
}

static int
parse_landlock_rule(struct failure *f, const unsigned char *p, uint32_t len, struct config *cfg)
{
    struct landlock_rule *grown, *rule;
    if (!cfg->has_landlock)
        return config_error(f, "Landlock rule before the LANDLOCK record", TAG_LANDLOCK_RULE);
    if (len < 10)
        return config_error(f, "Landlock rule too short", TAG_LANDLOCK_RULE);
    if (p[8] > 1)
        return config_error(f, "Landlock rule's optional flag is neither 0 nor 1", TAG_LANDLOCK_RULE);
    grown = realloc(cfg->rules, (cfg->n_rules + 1) * sizeof *grown);
    if (grown == NULL)
        return out_of_memory(f);
    cfg->rules = grown;
    rule = &grown[cfg->n_rules];
    rule->access = get_u64(p);
    rule->optional = p[8];
    if (parse_bytes(f, TAG_LANDLOCK_RULE, p + 9, len - 9, 0, &rule->path) < 0)
        return -1;
    cfg->n_rules++;
    return 0;
}

#ifdef SBX_STAGE2_FAULTS
static int
parse_fault(struct failure *f, const unsigned char *p, uint32_t len, struct config *cfg)
{
    size_t i;
    if (parse_bytes(f, TAG_FAULT, p, len, 0, &cfg->fault) < 0)
        return -1;
    for (i = 0; i < sizeof fault_steps / sizeof fault_steps[0]; i++)
        if (strcmp(cfg->fault, fault_steps[i]) == 0)
            return 0;
    return config_error(f, "unknown fault step", TAG_FAULT);
}
#endif

static int
parse_proxy_listen(struct failure *f, const unsigned char *p, uint32_t len, struct config *cfg)
{
    uint16_t port;

    if (expect_length(f, TAG_PROXY_LISTEN, len, 6) < 0)
        return -1;
    if (parse_fd_payload(f, TAG_PROXY_LISTEN, p, 4, &cfg->proxy_channel_fd) < 0)
        return -1;
    port = get_u16(p + 4);
    if (port == 0)
        return config_error(f, "proxy port 0", TAG_PROXY_LISTEN);
    cfg->proxy_port = port;
    return 0;
}

static int
parse_record(struct failure *f, unsigned int tag, unsigned char *p, uint32_t len, struct config *cfg)
{
    switch (tag) {
    case TAG_CWD:
        return parse_bytes(f, tag, p, len, 0, &cfg->cwd);
    case TAG_ARGV:
        if (parse_string_list(f, tag, p, len, &cfg->argv) < 0)
            return -1;
        return cfg->argv[0] == NULL ? config_error(f, "empty argv", tag) : 0;
    case TAG_ENV:
        if (parse_string_list(f, tag, p, len, &cfg->envp) < 0)
            return -1;
        return check_environment(f, cfg->envp);
    case TAG_SEARCH_PATH:
        return parse_bytes(f, tag, p, len, 1, &cfg->search_path);
    case TAG_RLIMIT:
        return parse_rlimit(f, p, len, cfg);
    case TAG_LANDLOCK:
        return parse_landlock(f, p, len, cfg);
    case TAG_LANDLOCK_RULE:
        return parse_landlock_rule(f, p, len, cfg);
    case TAG_SECCOMP_FD:
        return parse_fd_payload(f, tag, p, len, &cfg->seccomp_fd);
    case TAG_EXE_FD:
        return parse_fd_payload(f, tag, p, len, &cfg->exe_fd);
    case TAG_PROXY_LISTEN:
        return parse_proxy_listen(f, p, len, cfg);
    case TAG_SUPERVISE:
        if (expect_length(f, tag, len, 0) < 0)
            return -1;
        cfg->supervise = 1;
        return 0;
#ifdef SBX_STAGE2_FAULTS
    case TAG_FAULT:
        return parse_fault(f, p, len, cfg);
#endif
    default:
        return config_error(f, "unknown record tag", tag);
    }
}

static int
is_singleton(unsigned int tag)
{
    return tag != TAG_RLIMIT && tag != TAG_LANDLOCK_RULE;
}

/* Parse the buffer into cfg. On failure cfg->status_fd tells whether it can be reported. */
static int
parse_config(unsigned char *buf, size_t len, struct config *cfg, struct failure *f)
{
    uint32_t seen = 0; /* bit per singleton tag below 32; TAG_FAULT is tracked by cfg->fault */
    size_t at = CONFIG_HEADER_SIZE;

    if (len < CONFIG_HEADER_SIZE || memcmp(buf, CONFIG_MAGIC, 4) != 0)
        return fail(f, "config", EINVAL, "not a stage 2 config (bad magic)");
    if (get_u32(buf + 4) != CONFIG_VERSION)
        return fail(f, "config", EINVAL, "unsupported config version");

    while (at < len) {
        unsigned int tag;
        uint32_t rlen;
        unsigned char *payload;

        if (len - at < RECORD_HEADER_SIZE)
            return fail(f, "config", EINVAL, "truncated record header");
        tag = get_u16(buf + at);
        rlen = get_u32(buf + at + 2);
        payload = buf + at + RECORD_HEADER_SIZE;
        if (rlen > len - at - RECORD_HEADER_SIZE)
            return config_error(f, "truncated record", tag);
        at += RECORD_HEADER_SIZE + (size_t)rlen;

        /* Everything after the status fd can be reported on it, so it must come first. */
        if (cfg->status_fd < 0) {
            if (tag != TAG_STATUS_FD)
                return fail(f, "config", EINVAL, "the first record is not STATUS_FD");
            if (parse_fd_payload(f, tag, payload, rlen, &cfg->status_fd) < 0)
                return -1;
            seen |= 1U << TAG_STATUS_FD;
            continue;
        }
        if (is_singleton(tag)) {
            int duplicate = tag < 32 ? (int)((seen >> tag) & 1) : (tag == TAG_FAULT && cfg->fault != NULL);
            if (duplicate)
                return config_error(f, "duplicate record", tag);
            if (tag < 32)
                seen |= 1U << tag;
        }
        if (parse_record(f, tag, payload, rlen, cfg) < 0)
            return -1;
    }
    if (cfg->status_fd < 0)
        return fail(f, "config", EINVAL, "no STATUS_FD record");
    if (cfg->argv == NULL)
        return fail(f, "config", EINVAL, "no ARGV record");
    return 0;
}

static int
read_config(int config_fd, struct config *cfg, struct failure *f)
{
    static char *empty_environment[] = {NULL};
    unsigned char *buf;
    size_t len;

    memset(cfg, 0, sizeof *cfg);
    cfg->status_fd = cfg->seccomp_fd = cfg->exe_fd = cfg->proxy_channel_fd = -1;
    if (read_whole_fd(config_fd, &buf, &len) < 0)
        return fail(f, "config", errno, "cannot read the config descriptor");
    /* Safe here: the config memfd is ours alone and fully read. */
    close(config_fd);
    if (parse_config(buf, len, cfg, f) < 0)
        return -1;
    if (cfg->envp == NULL)
        cfg->envp = empty_environment;
    if (cfg->search_path == NULL)
        cfg->search_path = DEFAULT_SEARCH_PATH;
#ifdef SBX_STAGE2_FAULTS
    injected_fault = cfg->fault;
#endif
    return 0;
}

#ifdef SBX_STAGE2_FAULTS
/* Test builds only: hygiene runs before the config is parsed, so a "close_range" fault
 * is looked for ahead of it, with a shallow scan that validates nothing. */
static void
peek_fault(int config_fd)
{
    unsigned char *buf;
    size_t len, at = CONFIG_HEADER_SIZE;

    if (read_whole_fd(config_fd, &buf, &len) < 0)
        return;
    while (len >= at && len - at >= RECORD_HEADER_SIZE) {
        unsigned int tag = get_u16(buf + at);
        uint32_t rlen = get_u32(buf + at + 2);
        if (rlen > len - at - RECORD_HEADER_SIZE)
            break;
        if (tag == TAG_FAULT && rlen == strlen("close_range") &&
            memcmp(buf + at + RECORD_HEADER_SIZE, "close_range", rlen) == 0)
            injected_fault = "close_range";
        at += RECORD_HEADER_SIZE + (size_t)rlen;
    }
    free(buf);
}
#endif


/* ---- preserved fds ------------------------------------------------------------------------ */

static int
fd_failure(struct failure *f, int err, const char *what, int fd)
{
    fail(f, "preserved-fd", err, what);
    text_add_u64(&f->detail, (uint64_t)fd);
    return -1;
}

/* Codex's clear_cloexec, for each kept fd: read the flags, and clear FD_CLOEXEC only when
 * it is set. A failure (typically EBADF: the caller closed it) names the descriptor. */
static int
make_preserved_fds_inheritable(const struct keep_list *keep, struct failure *f)
{
    size_t i;
    for (i = 0; i < keep->n; i++) {
        int fd = keep->fds[i];
        /* Safe here: only the descriptor flag of an fd the caller asked us to pass on. */
        int flags = (int)FAULTABLE("preserved-fd", fcntl(fd, F_GETFD));
        if (flags < 0)
            return fd_failure(f, errno, "failed to read fd flags for preserved file descriptor ", fd);
        if (!(flags & FD_CLOEXEC))
            continue;
        if (fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0)
            return fd_failure(f, errno, "failed to clear close-on-exec for preserved file descriptor ", fd);
    }
    return 0;
}


/* ---- chdir, rlimits, no_new_privs ------------------------------------------------------------ */

static int
change_directory(const char *cwd, struct failure *f)
{
    /* Safe here: the namespace's view is final, and the command expects to start here. */
    if (FAULTABLE("chdir", chdir(cwd)) < 0)
        return fail(f, "chdir", errno, cwd);
    return 0;
}

/* The network bridge: a TCP listener on 127.0.0.1 inside this network namespace, handed
 * to the front end over the channel socket (SCM_RIGHTS) and closed here. The front end
 * accepts on it and enforces the allowlist on every connection (sandbox/netproxy.py), so
 * nothing of the bridge stays in the command: no descriptor, no unix socket to reach the
 * host by, no process. Safe here: the namespace is final and seccomp, installed later,
 * refuses new AF_UNIX sockets to the command; this step runs before it. */
static int
hand_over_proxy_listener(const struct config *cfg, struct failure *f)
{
    struct sockaddr_in addr;
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *cmsg;
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    char byte = 'L';
    int listener, one = 1;

    listener = (int)FAULTABLE("network-bridge", socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener < 0)
        return fail(f, "network-bridge", errno, "socket(AF_INET)");
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons(cfg->proxy_port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    (void)setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(listener, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        fail(f, "network-bridge", errno, "bind 127.0.0.1:");
        text_add_u64(&f->detail, cfg->proxy_port);
        close(listener);
        return -1;
    }
    if (listen(listener, 128) < 0) {
        fail(f, "network-bridge", errno, "listen");
        close(listener);
        return -1;
    }
    memset(&msg, 0, sizeof(msg));
    memset(&control, 0, sizeof(control));
    iov.iov_base = &byte;
    iov.iov_len = 1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &listener, sizeof(int));
    if (sendmsg(cfg->proxy_channel_fd, &msg, MSG_NOSIGNAL) != 1) {
        fail(f, "network-bridge", errno, "cannot hand the listener to sbx");
        close(listener);
        return -1;
    }
    /* Our copies go: the front end holds the only listener, and the channel ends here. */
    close(listener);
    close(cfg->proxy_channel_fd);
    return 0;
}

/* ---- supervisor (tiers without a pid namespace) ------------------------------------------ */

/* Without a pid namespace nothing ends the processes a command leaves behind: one that
 * calls setsid and double-forks would keep the caller's terminal, its locks and the run's
 * output pipes. So stage 2 forks: the parent stays outside every layer as a child
 * subreaper (every orphan below it is re-parented to it, and CLONE_PARENT is refused to
 * the command), holds no descriptor, waits for the command, then SIGKILLs whatever is left
 * and exits with the command's status (128+N for signal N). SIGTERM (sbx's kill, or the
 * death of sbx's process through PDEATHSIG) makes it sweep at once. Landlock's signal
 * scope (ABI 6) keeps the command from signalling it. */
static volatile sig_atomic_t sweep_requested;

static void
request_sweep(int signum)
{
    (void)signum;
    sweep_requested = 1;
}

/* SIGKILL every current child (the command, and the orphans re-parented to us), reading
 * the whole list: it can be long (up to the nproc limit). Returns how many it named. */
static long
kill_children(void)
{
    char buf[4096];
    struct text t;
    ssize_t n;
    long pid = 0, named = 0;
    int fd, in_number = 0;

    memset(&t, 0, sizeof t);
    text_add(&t, "/proc/self/task/");
    text_add_i64(&t, getpid());
    text_add(&t, "/children");
    t.data[t.len] = '\0';
    fd = open(t.data, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    /* A number can span two reads: the parse state carries over. */
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                pid = pid * 10 + (buf[i] - '0');
                in_number = 1;
            } else if (in_number) {
                kill((pid_t)pid, SIGKILL);
                named++;
                pid = 0;
                in_number = 0;
            }
        }
    }
    if (in_number) {
        kill((pid_t)pid, SIGKILL);
        named++;
    }
    close(fd);
    return named;
}

/* Reap every child that has already ended; the command's status is kept when seen. */
static void
reap_ended(pid_t command, int *status, int *have_status)
{
    pid_t reaped;
    int st;

    while ((reaped = waitpid(-1, &st, WNOHANG)) > 0) {
        if (reaped == command && !*have_status) {
            *status = st;
            *have_status = 1;
        }
    }
}

static void __attribute__((noreturn))
supervise(pid_t command, pid_t parent)
{
    int status = 0, have_status = 0, st;
    pid_t reaped;

    /* Safe here: the supervisor runs no command code and needs no descriptor; the caller's
     * terminal and the status pipe must not outlive the command through it. */
    sbx_close_range(0, ~0U, 0);
    /* sbx's process died before PDEATHSIG was set: sweep now. */
    if (getppid() != parent)
        sweep_requested = 1;
    while (!sweep_requested) {
        reaped = waitpid(-1, &st, 0);
        if (reaped == command) {
            status = st;
            have_status = 1;
            break;
        }
        if (reaped < 0 && errno == ECHILD)
            break;
    }
    /* The sweep. A process that forks and exits in a loop re-parents each new child to us;
     * the dead ones fill the list as zombies unless reaped, so each pass reaps first (the
     * list stays short and is read fast), then kills everything listed. A fork racing a
     * SIGKILL is aborted by the kernel (a fatal signal is pending), so every pass leaves
     * fewer places to run; it ends when a pass finds no child at all. */
    for (;;) {
        long named;

        reap_ended(command, &status, &have_status);
        named = kill_children();
        if (named == 0) {
            reaped = waitpid(-1, &st, WNOHANG);
            if (reaped < 0 && errno == ECHILD)
                break;
            continue;
        }
        if (named < 0) { /* no /proc: wait for what was already killed or ends by itself */
            reaped = waitpid(-1, &st, 0);
            if (reaped == command && !have_status) {
                status = st;
                have_status = 1;
            }
            if (reaped < 0 && errno == ECHILD)
                break;
        }
    }
    if (!have_status)
        _exit(128 + SIGKILL);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* Returns in the child (the command to be), never in the supervisor. */
static int
start_supervisor(const struct config *cfg, struct failure *f)
{
    struct sigaction sa;
    sigset_t term, old;
    pid_t parent = getppid(), child;

    /* Safe here: it only changes who inherits our orphans. */
    if (FAULTABLE("supervisor", prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) < 0)
        return fail(f, "supervisor", errno, "prctl(PR_SET_CHILD_SUBREAPER)");
    /* SIGTERM stays blocked across the fork: the child unblocks it right before exec
     * (reset_signals), the supervisor once its handler is in place. */
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &old);
    child = fork();
    if (child < 0) {
        int saved = errno;
        sigprocmask(SIG_SETMASK, &old, NULL);
        return fail(f, "supervisor", saved, "fork");
    }
    if (child == 0) {
        /* The command's side: it is no subreaper of its own descendants. */
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        return 0;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = request_sweep; /* no SA_RESTART: waitpid returns EINTR */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
    sigprocmask(SIG_SETMASK, &old, NULL);
    sigprocmask(SIG_UNBLOCK, &term, NULL);
    (void)cfg;
    supervise(child, parent);
}

static void
add_limit(struct text *t, rlim_t value)
{
    if (value == RLIM_INFINITY)
        text_add(t, "unlimited");
    else
        text_add_u64(t, (uint64_t)value);
}

static int
rlimit_failure(struct failure *f, const char *call, int resource, const struct rlimit *lim)
{
    fail(f, "rlimits", errno, call);
    text_add(&f->detail, "(resource ");
    text_add_i64(&f->detail, resource);
    if (lim != NULL) {
        text_add(&f->detail, ", soft ");
        add_limit(&f->detail, lim->rlim_cur);
        text_add(&f->detail, ", hard ");
        add_limit(&f->detail, lim->rlim_max);
    }
    text_add(&f->detail, ")");
    return -1;
}

/* Lower (never raise beyond the current hard limit) each requested limit: an unprivileged
 * caller cannot raise a hard limit, and a limit above it would only make setrlimit fail. */
static int
apply_rlimits(const struct config *cfg, struct failure *f)
{
    size_t i;
    for (i = 0; i < cfg->n_rlimits; i++) {
        const struct rlimit_request *r = &cfg->rlimits[i];
        struct rlimit cur, want;

        want.rlim_cur = r->soft < 0 ? RLIM_INFINITY : (rlim_t)r->soft;
        want.rlim_max = r->hard < 0 ? RLIM_INFINITY : (rlim_t)r->hard;
        /* Safe here: reading and lowering this process's own limits, inherited by exec. */
        if (getrlimit(r->resource, &cur) < 0)
            return rlimit_failure(f, "getrlimit", r->resource, NULL);
        if (cur.rlim_max != RLIM_INFINITY) {
            if (want.rlim_max == RLIM_INFINITY || want.rlim_max > cur.rlim_max)
                want.rlim_max = cur.rlim_max;
            if (want.rlim_cur == RLIM_INFINITY || want.rlim_cur > want.rlim_max)
                want.rlim_cur = want.rlim_max;
        }
        if (FAULTABLE("rlimits", setrlimit(r->resource, &want)) < 0)
            return rlimit_failure(f, "setrlimit", r->resource, &want);
    }
    return 0;
}

static int
set_no_new_privs(struct failure *f)
{
    /* Safe here: it only forbids gaining privileges at exec, and Landlock and seccomp need it. */
    if (FAULTABLE("no_new_privs", prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) < 0)
        return fail(f, "no_new_privs", errno, "prctl(PR_SET_NO_NEW_PRIVS)");
    return 0;
}


/* ---- Landlock ------------------------------------------------------------------------------ */

/* The rule's path opened one component at a time, never following a symlink (ELOOP) and
 * refusing "." and ".." (EINVAL): the plan names canonical paths, so a link anywhere in
 * one was planted after the plan was made (a writable workdir can hold one), and following
 * it would grant a hierarchy the plan never chose. Safe here: O_PATH opens nothing for
 * reading; it only names the rule's hierarchy. */
static int
open_rule_path(const char *path)
{
    char component[NAME_MAX + 1];
    const char *at = path, *end;
    struct stat st;
    int dir, next, saved;
    size_t n;

    if (path[0] != '/') {
        errno = EINVAL;
        return -1;
    }
    dir = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return -1;
    for (;;) {
        while (*at == '/')
            at++;
        if (*at == '\0')
            return dir;
        end = strchr(at, '/');
        n = end != NULL ? (size_t)(end - at) : strlen(at);
        if (n > NAME_MAX || (n == 1 && at[0] == '.') || (n == 2 && at[0] == '.' && at[1] == '.')) {
            close(dir);
            errno = n > NAME_MAX ? ENAMETOOLONG : EINVAL;
            return -1;
        }
        memcpy(component, at, n);
        component[n] = '\0';
        next = openat(dir, component, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        saved = errno;
        close(dir);
        if (next < 0) {
            errno = saved;
            return -1;
        }
        if (fstat(next, &st) < 0) {
            saved = errno;
            close(next);
            errno = saved;
            return -1;
        }
        if (S_ISLNK(st.st_mode)) {
            close(next);
            errno = ELOOP;
            return -1;
        }
        dir = next;
        at += n;
    }
}

static int
add_landlock_rule(int ruleset, const struct config *cfg, const struct landlock_rule *rule, struct failure *f)
{
    struct sbx_landlock_path_beneath_attr attr;
    struct stat st;
    int parent, saved;
    long rc;

    parent = open_rule_path(rule->path);
    if (parent < 0) {
        if (errno == ENOENT && rule->optional)
            return 0;
        return fail(f, "landlock", errno, rule->path);
    }
    if (fstat(parent, &st) < 0) {
        saved = errno;
        close(parent);
        return fail(f, "landlock", saved, rule->path);
    }
    memset(&attr, 0, sizeof attr);
    /* The kernel refuses directory rights on a rule for a file. */
    attr.allowed_access = S_ISDIR(st.st_mode) ? rule->access : rule->access & cfg->file_rights;
    attr.parent_fd = parent;
    /* Safe here: it adds to a ruleset that is not enforced until restrict_self. */
    rc = syscall(SYS_landlock_add_rule, ruleset, SBX_LANDLOCK_RULE_PATH_BENEATH, &attr, 0);
    saved = errno;
    close(parent);
    if (rc < 0) {
        fail(f, "landlock", saved, "landlock_add_rule(");
        text_add(&f->detail, rule->path);
        text_add(&f->detail, ")");
        return -1;
    }
    return 0;
}

/* Create the ruleset the plan derived and restrict this process; the kernel's ABI must be
 * at least the plan's, or a right the plan relies on would silently not be handled. */
static int
install_landlock(const struct config *cfg, struct failure *f)
{
    struct sbx_landlock_ruleset_attr attr;
    long abi;
    int err = 0, ruleset;
    size_t i;

    /* Safe here: a query that changes nothing. */
    abi = syscall(SYS_landlock_create_ruleset, NULL, 0, SBX_LANDLOCK_CREATE_RULESET_VERSION);
    if (abi < 0) {
        err = errno;
        abi = 0;
    }
    if (abi < (long)cfg->landlock_abi) {
        fail(f, "landlock", err, "the plan needs Landlock ABI ");
        text_add_u64(&f->detail, cfg->landlock_abi);
        text_add(&f->detail, ", the kernel has ");
        text_add_i64(&f->detail, abi);
        return -1;
    }

    memset(&attr, 0, sizeof attr);
    attr.handled_access_fs = cfg->handled_fs;
    attr.handled_access_net = cfg->handled_net;
    attr.scoped = cfg->scoped;
    /* Safe here: creating a ruleset restricts nothing until restrict_self. */
    ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0)
        return fail(f, "landlock", errno, "landlock_create_ruleset");
    /* The kernel already sets it; kept explicit so the command can never inherit it. */
    fcntl(ruleset, F_SETFD, FD_CLOEXEC);

    for (i = 0; i < cfg->n_rules; i++) {
        if (add_landlock_rule(ruleset, cfg, &cfg->rules[i], f) < 0) {
            close(ruleset);
            return -1;
        }
    }
    /* Safe here: no_new_privs is set, and it only narrows what this process may open. */
    if (FAULTABLE("landlock", syscall(SYS_landlock_restrict_self, ruleset, 0)) < 0) {
        err = errno;
        close(ruleset);
        return fail(f, "landlock", err, "landlock_restrict_self");
    }
    close(ruleset);
    return 0;
}


/* ---- seccomp --------------------------------------------------------------------------------- */

static int
load_bpf(const unsigned char *code, uint32_t len, size_t index, struct failure *f)
{
    struct sock_fprog prog;

    prog.len = (unsigned short)(len / sizeof(struct sock_filter));
    /* The kernel copies the program; it only reads through this pointer. */
    prog.filter = (struct sock_filter *)(uintptr_t)code;
    /* Safe here: no_new_privs is set and only exec (and a status write) follows the filters. */
    if (FAULTABLE("seccomp", syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) < 0) {
        fail(f, "seccomp", errno, "seccomp(SECCOMP_SET_MODE_FILTER) program ");
        text_add_u64(&f->detail, index);
        return -1;
    }
    return 0;
}

/* Load the programs the parent compiled, in order: each framed by a u32 little-endian
 * length, then that many bytes of struct sock_filter. Stacked filters all run; the
 * strictest answer wins. */
static int
install_seccomp(int seccomp_fd, struct failure *f)
{
    unsigned char *blob;
    size_t len, at = 0, count = 0;

    if (read_whole_fd(seccomp_fd, &blob, &len) < 0) {
        fail(f, "seccomp", errno, "cannot read the BPF descriptor ");
        text_add_u64(&f->detail, (uint64_t)seccomp_fd);
        return -1;
    }
    /* Closed before any filter is loaded, so no filter needs to allow close(). */
    close(seccomp_fd);

    while (at < len) {
        uint32_t size;
        if (len - at < 4)
            return fail(f, "seccomp", EINVAL, "malformed BPF (truncated frame header)");
        size = get_u32(blob + at);
        at += 4;
        if (size == 0 || size % sizeof(struct sock_filter) != 0 || size > len - at ||
            size / sizeof(struct sock_filter) > USHRT_MAX)
            return fail(f, "seccomp", EINVAL, "malformed BPF");
        if (load_bpf(blob + at, size, count, f) < 0)
            return -1;
        at += size;
        count++;
    }
    if (count == 0)
        return fail(f, "seccomp", EINVAL, "no BPF program arrived");
    return 0;
}


/* ---- exec ------------------------------------------------------------------------------------ */

/* Dispositions and the mask survive exec; the command expects the defaults. */
static void
reset_signals(void)
{
    struct sigaction dfl;
    sigset_t none;

    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigemptyset(&none);
    /* Safe here: single-threaded, and nothing of ours needs a handler any more. */
    sigaction(SIGPIPE, &dfl, NULL);
    sigaction(SIGXFSZ, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

static int
sbx_execve(const char *path, char *const argv[], char *const envp[])
{
    /* Safe here: every layer is installed; on success the status fd closes on exec. */
    return (int)FAULTABLE("exec", execve(path, argv, envp));
}

static int
sbx_fexecve(int fd, char *const argv[], char *const envp[])
{
    /* glibc's fexecve would fall back to /proc/self/fd, which the sandbox may hide. */
    /* Safe here: every layer is installed; on success the status fd closes on exec. */
    return (int)FAULTABLE("exec", syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH));
}

static int
exec_failure(struct failure *f, int err, int exit_status, const char *path, const char *suffix)
{
    fail(f, "exec", err, path);
    text_add(&f->detail, suffix);
    f->exit_status = exit_status;
    return -1;
}

/* Classify a failed exec of `path` the way shells report it. `exists` says the file is
 * known to be there (an fd); otherwise stat decides. */
static int
exec_failed(struct failure *f, int err, const char *path, const char *name, int exists)
{
    struct stat st;
    if (err == ENOENT) {
        /* The file is there: its #! interpreter or ELF loader is what is missing. */
        if (exists || stat(path, &st) == 0)
            return exec_failure(f, err, EXIT_NOT_EXECUTABLE, path,
                                ": its interpreter or loader is not visible in the sandbox");
        return exec_failure(f, err, EXIT_NOT_FOUND, name, ": command not found");
    }
    if (err == EACCES)
        return exec_failure(f, err, EXIT_NOT_EXECUTABLE, path, ": permission denied");
    return exec_failure(f, err, EXIT_NOT_EXECUTABLE, path, "");
}

/* execvp's search over the config's path, without its /bin/sh retry for ENOEXEC. */
static int
search_and_exec(const struct config *cfg, struct failure *f)
{
    const char *name = cfg->argv[0];
    size_t name_len = strlen(name);
    const char *dir = cfg->search_path;
    char candidate[PATH_MAX + NAME_MAX + 2];
    char denied[sizeof candidate];
    int saw_denied = 0;

    if (name_len > NAME_MAX)
        return exec_failed(f, ENAMETOOLONG, name, name, 0);
    if (name_len == 0)
        return exec_failure(f, ENOENT, EXIT_NOT_FOUND, name, ": command not found");
    for (;;) {
        const char *end = strchrnul(dir, ':');
        size_t dir_len = (size_t)(end - dir);

        /* A directory too long to join is skipped, as execvp does. */
        if (dir_len + 1 + name_len + 1 <= sizeof candidate) {
            int err;
            if (dir_len == 0) {
                memcpy(candidate, ".", 1);
                dir_len = 1;
            } else {
                memcpy(candidate, dir, dir_len);
            }
            candidate[dir_len] = '/';
            memcpy(candidate + dir_len + 1, name, name_len + 1);

            sbx_execve(candidate, cfg->argv, cfg->envp);
            err = errno;
            switch (err) {
            case EACCES:
                if (!saw_denied)
                    memcpy(denied, candidate, dir_len + 1 + name_len + 1);
                saw_denied = 1;
                break;
            case ENOENT: {
                struct stat st;
                if (stat(candidate, &st) == 0)
                    return exec_failed(f, err, candidate, name, 1);
                break;
            }
            case ENOTDIR:
            case ESTALE:
            case ENODEV:
            case ETIMEDOUT:
                break;
            default:
                return exec_failed(f, err, candidate, name, 0);
            }
        }
        if (*end == '\0')
            break;
        dir = end + 1;
    }
    if (saw_denied)
        return exec_failed(f, EACCES, denied, name, 1);
    /* Not exec_failed: a file of that name in the working directory is not a match. */
    return exec_failure(f, ENOENT, EXIT_NOT_FOUND, name, ": command not found");
}

/* Returns only on failure. */
static int
exec_command(const struct config *cfg, struct failure *f)
{
    const char *name = cfg->argv[0];

    reset_signals();
    if (cfg->exe_fd >= 0) {
        /* The bytes the parent verified, whatever now sits at their path. */
        sbx_fexecve(cfg->exe_fd, cfg->argv, cfg->envp);
        return exec_failed(f, errno, name, name, 1);
    }
    if (strchr(name, '/') != NULL) {
        sbx_execve(name, cfg->argv, cfg->envp);
        return exec_failed(f, errno, name, name, 0);
    }
    return search_and_exec(cfg, f);
}


/* ---- main ------------------------------------------------------------------------------------ */

int
main(int argc, char **argv)
{
    struct keep_list keep;
    struct config cfg;
    struct failure f;
    enum hygiene hygiene;
    int config_fd;

    if (parse_arguments(argc, argv, &config_fd, &keep) < 0)
        usage();
#ifdef SBX_STAGE2_FAULTS
    peek_fault(config_fd);
#endif
    hygiene = mark_inherited_fds_cloexec(&keep);

    if (read_config(config_fd, &cfg, &f) < 0) {
        if (cfg.status_fd >= 0)
            report_error(cfg.status_fd, &f);
        _exit(EXIT_SETUP_FAILED);
    }
    report_started(cfg.status_fd);
    if (hygiene == HYGIENE_WALKED)
        report_note(cfg.status_fd, "fd-hygiene", "close_range unavailable: walked every fd");

    if (make_preserved_fds_inheritable(&keep, &f) < 0)
        goto failed;
    if (cfg.cwd != NULL && change_directory(cfg.cwd, &f) < 0)
        goto failed;
    if (cfg.proxy_channel_fd >= 0 && hand_over_proxy_listener(&cfg, &f) < 0)
        goto failed;
    if (cfg.supervise && start_supervisor(&cfg, &f) < 0)
        goto failed;
    if (apply_rlimits(&cfg, &f) < 0)
        goto failed;
    if (set_no_new_privs(&f) < 0)
        goto failed;
    if (cfg.has_landlock && install_landlock(&cfg, &f) < 0)
        goto failed;
    if (cfg.seccomp_fd >= 0 && install_seccomp(cfg.seccomp_fd, &f) < 0)
        goto failed;
    exec_command(&cfg, &f);

failed:
    report_error(cfg.status_fd, &f);
    _exit(f.exit_status);
}
