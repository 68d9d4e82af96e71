/* weftrun.c - start N local ranks of a program, like a tiny mpirun or torchrun.
 * Each rank gets the WEFT_* and torchrun variables, its output lines come back
 * prefixed with its rank, signals are forwarded, and one failing rank stops the
 * job. Self-contained on purpose: it must work before the weft library is built.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
    RANKS_MAX = 4096,
    LINE_BUF_SIZE = 16384, /* longer lines are split, each piece prefixed */
    PREFIX_SIZE = 16,      /* "[4095] " and its terminator fit */
    KILL_GRACE_S = 5,      /* between SIGTERM and SIGKILL when stopping */
    DRAIN_READS_MAX = 256, /* bounds draining a pipe a grandchild still fills */
    EXIT_INTERNAL = 1,
    EXIT_USAGE = 2,
    EXIT_TIMEOUT = 124,
};

static const int forwarded_signals[] = {SIGINT,  SIGTERM, SIGHUP,
                                        SIGQUIT, SIGUSR1, SIGUSR2};

/* Every signal whose disposition weftrun changes, so that each rank can be
 * given back the disposition weftrun itself started with. */
static const int changed_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,
                                      SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE};

#define COUNT_OF(array) (sizeof(array) / sizeof((array)[0]))

/* The only global state: a signal handler can reach nothing else. */
static struct {
    int pipe_read;  /* the poll loop reads one byte per signal here */
    int pipe_write; /* the handler writes them here; non-blocking */
    struct sigaction at_entry[NSIG];
} signals = {.pipe_read = -1, .pipe_write = -1};

enum bind_mode { BIND_AUTO, BIND_CORE, BIND_NONE };

struct options {
    int nranks;
    double timeout_s; /* 0: no limit */
    bool prefix;
    enum bind_mode bind;
    bool elastic; /* a rank killed by a signal leaves the others running */
    char **prog_argv;
};

/* One pipe from a rank's stdout or stderr, holding the start of a line that
 * has not ended yet. */
struct rank_stream {
    int fd;     /* read end, non-blocking; -1 once closed */
    int out_fd; /* weftrun's own stdout or stderr */
    int rank;
    size_t len;
    char buf[LINE_BUF_SIZE];
};

struct rank {
    pid_t pid;
    /* Started and not yet reaped: only then may it be signalled, because
     * only then can its pid not belong to some other process. */
    bool live;
    struct rank_stream out, err;
};

struct job {
    struct options opt;
    struct rank *ranks;
    struct pollfd *pollfds;        /* the self-pipe, then the open streams */
    struct rank_stream **polled;   /* polled[i] is the stream of pollfds[i] */
    int live_count;
    int prefix_width;
    const char *rendezvous;
    char *master_addr;
    const char *master_port; /* NULL: a preset rendezvous without a port */
    char rendezvous_buf[32];
    struct rlimit entry_fd_limit;
    bool fd_limit_raised;
    int bind_cpus[CPU_SETSIZE]; /* CPUs weftrun may use; rank r gets r % count */
    int bind_cpu_count;         /* 0: ranks are not bound */
    double started_at;
    bool stopping; /* SIGTERM went to every rank; SIGKILL follows at kill_at */
    double kill_at;
    bool killed;
    bool timed_out;
    bool failed; /* exit_code holds the first failure */
    int exit_code;
    char line_out[PREFIX_SIZE + LINE_BUF_SIZE + 1];
};

/* ---- small helpers ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Writes everything, waiting out a non-blocking descriptor shared with others. */
static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t written = write(fd, data, len);
        if (written > 0) {
            data += written;
            len -= (size_t)written;
        } else if (written < 0 && errno == EAGAIN) {
            struct pollfd wait_writable = {.fd = fd, .events = POLLOUT};
            poll(&wait_writable, 1, -1);
        } else if (written < 0 && errno != EINTR) {
            return -1;
        }
    }
    return 0;
}

/* weftrun's own messages go out in one write, so they never split a rank's line. */
__attribute__((format(printf, 1, 2))) static void say(const char *format, ...)
{
    char message[512];
    va_list args;
    va_start(args, format);
    int len = vsnprintf(message, sizeof message, format, args);
    va_end(args);
    if (len < 0)
        return;
    size_t size = (size_t)len < sizeof message ? (size_t)len : sizeof message - 1;
    (void)write_all(STDERR_FILENO, message, size);
}

static int decimal_digits(int value)
{
    int digits = 1;
    for (; value >= 10; value /= 10)
        digits++;
    return digits;
}

/* ---- command line ---- */

static void print_usage(FILE *to)
{
    fprintf(to,
            "usage: weftrun [-n N] [--timeout SECONDS] [--bind core|none] [--no-prefix] [--elastic]\n"
            "               [--] PROG [ARGS...]\n"
            "Start N ranks of PROG on this machine, each with WEFT_RANK, WEFT_SIZE,\n"
            "WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE, WEFT_RENDEZVOUS and the torchrun variables\n"
            "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.\n"
            "  -n N, --np N        number of ranks, 1 to %d (default 1)\n"
            "  --timeout SECONDS   stop all ranks and exit 124 once the job runs this long\n"
            "  --bind core|none    pin rank r to one CPU (r modulo the CPUs weftrun may use);\n"
            "                      default: core when ranks <= CPUs, as mpirun does\n"
            "  --no-prefix         do not start output lines with \"[rank] \"\n"
            "  --elastic           a rank killed by a signal is reported, and the others go on\n"
            "                      (they recover with weft_comm_shrink); a rank that exits\n"
            "                      non-zero still stops the job\n"
            "  -h, --help          print this help\n"
            "If a rank fails, the others are stopped and weftrun exits with its status\n"
            "(128+N for signal N). WEFT_RENDEZVOUS, if set, is kept; otherwise a free\n"
            "port on 127.0.0.1 is chosen. WEFT_AUTH_TOKEN, if set, is kept; otherwise a\n"
            "random job secret is made, which every connection of the job must prove.\n"
            "WEFT_JOB_ID, if set, is kept; otherwise one is made, and the rendezvous\n"
            "refuses ranks of any other job.\n",
            RANKS_MAX);
}

static bool parse_rank_count(const char *text, int *count)
{
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 1 || value > RANKS_MAX)
        return false;
    *count = (int)value;
    return true;
}

static bool parse_seconds(const char *text, double *seconds)
{
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    /* The upper bound keeps deadlines and poll's millisecond timeout in range
     * (and rejects inf; !(value > 0) rejects nan). */
    if (errno != 0 || end == text || *end != '\0' || !(value > 0) || value > 1e7)
        return false;
    *seconds = value;
    return true;
}

enum parse_result { PARSE_RUN, PARSE_HELP, PARSE_BAD };

static enum parse_result parse_options(int argc, char **argv, struct options *opt)
{
    static const struct option long_options[] = {
        {.name = "np", .has_arg = required_argument, .val = 'n'},
        {.name = "timeout", .has_arg = required_argument, .val = 't'},
        {.name = "no-prefix", .has_arg = no_argument, .val = 'p'},
        {.name = "bind", .has_arg = required_argument, .val = 'b'},
        {.name = "elastic", .has_arg = no_argument, .val = 'e'},
        {.name = "help", .has_arg = no_argument, .val = 'h'},
        {0},
    };
    *opt = (struct options){.nranks = 1, .prefix = true};
    int option;
    /* '+' stops at PROG, so options meant for PROG are left to it. */
    while ((option = getopt_long(argc, argv, "+n:h", long_options, NULL)) != -1) {
        if (option == 'n' && !parse_rank_count(optarg, &opt->nranks)) {
            fprintf(stderr, "weftrun: the number of ranks must be 1 to %d, not '%s'\n",
                    RANKS_MAX, optarg);
            return PARSE_BAD;
        }
        if (option == 't' && !parse_seconds(optarg, &opt->timeout_s)) {
            fprintf(stderr, "weftrun: --timeout wants a positive number of seconds, not '%s'\n",
                    optarg);
            return PARSE_BAD;
        }
        if (option == 'p')
            opt->prefix = false;
        if (option == 'e')
            opt->elastic = true;
        if (option == 'b') {
            if (!strcmp(optarg, "core")) {
                opt->bind = BIND_CORE;
            } else if (!strcmp(optarg, "none")) {
                opt->bind = BIND_NONE;
            } else {
                fprintf(stderr, "weftrun: --bind wants core or none, not '%s'\n", optarg);
                return PARSE_BAD;
            }
        }
        if (option == 'h')
            return PARSE_HELP;
        if (option == '?') /* getopt_long has said what was wrong */
            return PARSE_BAD;
    }
    if (optind >= argc) {
        fprintf(stderr, "weftrun: no program to run\n");
        return PARSE_BAD;
    }
    opt->prog_argv = argv + optind;
    return PARSE_RUN;
}

/* ---- process set-up ---- */

/* With 0-2 open, pipe descriptors never land there, where a rank's dup2 onto
 * its own stdout would be a no-op that leaves the descriptor close-on-exec. */
static void keep_standard_fds_open(void)
{
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF)
            open("/dev/null", O_RDWR); /* takes the lowest free number: fd */
}

static void on_signal(int sig)
{
    int saved_errno = errno;
    unsigned char byte = (unsigned char)sig;
    /* When the pipe is full the byte is dropped: the loop is already bound
     * to wake up, and children are reaped on every wake-up anyway. */
    ssize_t ignored = write(signals.pipe_write, &byte, 1);
    (void)ignored;
    errno = saved_errno;
}

static int install_signal_handlers(void)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        return -1;
    signals.pipe_read = fds[0];
    signals.pipe_write = fds[1];
    for (size_t i = 0; i < COUNT_OF(changed_signals); i++)
        sigaction(changed_signals[i], NULL, &signals.at_entry[changed_signals[i]]);

    struct sigaction catching = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
    sigfillset(&catching.sa_mask);
    for (size_t i = 0; i < COUNT_OF(forwarded_signals); i++) {
        int sig = forwarded_signals[i];
        /* Ignored at entry (nohup, a script's background job): weftrun and
         * its ranks keep ignoring it, as the caller asked. */
        if (signals.at_entry[sig].sa_handler != SIG_IGN)
            sigaction(sig, &catching, NULL);
    }
    catching.sa_flags |= SA_NOCLDSTOP;
    sigaction(SIGCHLD, &catching, NULL);
    /* A closed stdout must give EPIPE, not kill weftrun before it has
     * stopped the ranks. */
    struct sigaction ignore = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &ignore, NULL);
    return 0;
}

/* Two pipes per rank: 4096 ranks need more than the usual soft limit of 1024. */
static void raise_fd_limit(struct job *job)
{
    struct rlimit limit;
    rlim_t needed = (rlim_t)job->opt.nranks * 2 + 16;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= needed)
        return;
    job->entry_fd_limit = limit;
    limit.rlim_cur = limit.rlim_max != RLIM_INFINITY && limit.rlim_max < needed
                         ? limit.rlim_max
                         : needed;
    job->fd_limit_raised = setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

/* Binding as mpirun does: with no more ranks than usable CPUs, each rank gets
 * its own, so two ranks never share a CPU while another idles (measured here:
 * unbound 2-rank runs were bimodal, 1.9 or 3.2 GB/s; bound, always ~3.1). */
static void choose_bind_cpus(struct job *job)
{
    cpu_set_t allowed;
    job->bind_cpu_count = 0;
    if (job->opt.bind == BIND_NONE || sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return;
    int count = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &allowed))
            job->bind_cpus[count++] = cpu;
    if (job->opt.bind == BIND_AUTO && job->opt.nranks > count)
        return; /* oversubscribed: let the scheduler balance */
    job->bind_cpu_count = count;
}

/* The kernel picks a free port, which is released again for rank 0 to bind.
 * Someone else could take it in between: a race every launcher of this kind
 * accepts, torchrun included. */
static int pick_free_port(void)
{
    int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int port = -1;
    if (bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        getsockname(sock, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(sock);
    return port;
}

/* MASTER_ADDR and MASTER_PORT come from a preset WEFT_RENDEZVOUS, so that
 * torchrun-style programs meet at the same place: "host:port" or "[v6]:port". */
static int split_preset_rendezvous(struct job *job, const char *preset)
{
    const char *colon = strrchr(preset, ':');
    const char *host_end = colon ? colon : preset + strlen(preset);
    const char *host = preset;
    if (host[0] == '[' && host_end > host + 1 && host_end[-1] == ']') {
        host++;
        host_end--;
    }
    job->master_addr = strndup(host, (size_t)(host_end - host));
    job->master_port = colon ? colon + 1 : NULL;
    return job->master_addr ? 0 : -1;
}

static int random_hex(char *hex, size_t raw_len);

/* A job identity for the ranks (WEFT_JOB_ID), unless the user set one: the
 * rendezvous refuses a rank of another job even when two jobs share one
 * WEFT_AUTH_TOKEN and one port. */
static int choose_job_id(void)
{
    const char *preset = getenv("WEFT_JOB_ID");
    if (preset && preset[0] != '\0')
        return 0;
    char hex[2 * 8 + 1], id[64];
    if (random_hex(hex, 8) != 0)
        return -1;
    snprintf(id, sizeof id, "weftrun-%ld-%s", (long)getpid(), hex);
    return setenv("WEFT_JOB_ID", id, 1);
}

/* A job secret for the ranks (WEFT_AUTH_TOKEN), unless the user set one:
 * every connection of the job must prove it, so strangers cannot join. */
static int choose_auth_token(void)
{
    const char *preset = getenv("WEFT_AUTH_TOKEN");
    if (preset && preset[0] != '\0')
        return 0;
    char hex[2 * 16 + 1];
    if (random_hex(hex, 16) != 0)
        return -1;
    return setenv("WEFT_AUTH_TOKEN", hex, 1);
}

/* `raw_len` random bytes as hex into `hex` (2 * raw_len + 1 bytes). */
static int random_hex(char *hex, size_t raw_len)
{
    unsigned char raw[32];
    if (raw_len > sizeof raw)
        return -1;
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno != EINTR)
            return -1;
        if (n > 0)
            got += (size_t)n;
    }
    for (size_t i = 0; i < raw_len; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

static int choose_rendezvous(struct job *job)
{
    const char *preset = getenv("WEFT_RENDEZVOUS");
    if (preset && preset[0] != '\0') {
        job->rendezvous = preset;
        return split_preset_rendezvous(job, preset);
    }
    int port = pick_free_port();
    if (port < 0)
        return -1;
    snprintf(job->rendezvous_buf, sizeof job->rendezvous_buf, "127.0.0.1:%d", port);
    job->rendezvous = job->rendezvous_buf;
    job->master_addr = strdup("127.0.0.1");
    job->master_port = strchr(job->rendezvous_buf, ':') + 1;
    return job->master_addr ? 0 : -1;
}

/* ---- starting a rank ---- */

static void set_rank_environment(const struct job *job, int rank)
{
    char rank_text[16], size_text[16];
    snprintf(rank_text, sizeof rank_text, "%d", rank);
    snprintf(size_text, sizeof size_text, "%d", job->opt.nranks);
    /* All ranks run here, so the local and global numbering coincide. */
    const char *names_values[][2] = {
        {"WEFT_RANK", rank_text},       {"WEFT_SIZE", size_text},
        {"WEFT_LOCAL_RANK", rank_text}, {"WEFT_LOCAL_SIZE", size_text},
        {"RANK", rank_text},            {"WORLD_SIZE", size_text},
        {"LOCAL_RANK", rank_text},      {"LOCAL_WORLD_SIZE", size_text},
        {"WEFT_RENDEZVOUS", job->rendezvous}, {"MASTER_ADDR", job->master_addr},
        {"MASTER_PORT", job->master_port},
    };
    for (size_t i = 0; i < COUNT_OF(names_values); i++)
        if (names_values[i][1])
            setenv(names_values[i][0], names_values[i][1], 1);
}

/* Runs in the forked child, with every signal blocked. weftrun is single
 * threaded, so setenv and stdio are safe here. */
static _Noreturn void become_rank(const struct job *job, int rank, int out_fd, int err_fd,
                                  pid_t weftrun_pid, const sigset_t *entry_mask)
{
    /* Ranks die with weftrun even when it is killed -9 and cannot stop them. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != weftrun_pid) /* weftrun died before prctl took effect */
        _exit(EXIT_INTERNAL);
    for (size_t i = 0; i < COUNT_OF(changed_signals); i++)
        sigaction(changed_signals[i], &signals.at_entry[changed_signals[i]], NULL);
    sigprocmask(SIG_SETMASK, entry_mask, NULL);
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
        _exit(EXIT_INTERNAL);
    if (job->fd_limit_raised)
        setrlimit(RLIMIT_NOFILE, &job->entry_fd_limit);
    if (job->bind_cpu_count > 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(job->bind_cpus[rank % job->bind_cpu_count], &one);
        sched_setaffinity(0, sizeof one, &one); /* best effort, like mpirun's binding */
    }
    set_rank_environment(job, rank);

    const char *prog = job->opt.prog_argv[0];
    execvp(prog, job->opt.prog_argv);
    int exec_errno = errno;
    dprintf(STDERR_FILENO, "weftrun: cannot run %s: %s\n", prog, strerror(exec_errno));
    /* The shell's convention: 127 when it is not there, 126 when it cannot run. */
    _exit(exec_errno == ENOENT || exec_errno == ENOTDIR ? 127 : 126);
}

static void stream_open(struct rank_stream *stream, int fd, int out_fd, int rank)
{
    /* Non-blocking, so a rank's pipes can be drained when it exits. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    stream->fd = fd;
    stream->out_fd = out_fd;
    stream->rank = rank;
    stream->len = 0;
}

static void close_pipe(int fds[2])
{
    int saved_errno = errno;
    close(fds[0]);
    close(fds[1]);
    errno = saved_errno;
}

static int spawn_rank(struct job *job, int rank)
{
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(err_pipe, O_CLOEXEC) != 0)
        goto fail_out_pipe;

    /* Blocked across fork, so weftrun's handlers never run in the child,
     * where they would write into weftrun's self-pipe. */
    sigset_t all, entry_mask;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &entry_mask);
    pid_t weftrun_pid = getpid();
    pid_t pid = fork();
    if (pid == 0)
        become_rank(job, rank, out_pipe[1], err_pipe[1], weftrun_pid, &entry_mask);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &entry_mask, NULL);
    if (pid < 0) {
        errno = fork_errno;
        close_pipe(err_pipe);
        goto fail_out_pipe;
    }
    /* Only the rank may hold the write ends, or end of file never comes. */
    close(out_pipe[1]);
    close(err_pipe[1]);
    struct rank *r = &job->ranks[rank];
    r->pid = pid;
    r->live = true;
    job->live_count++;
    stream_open(&r->out, out_pipe[0], STDOUT_FILENO, rank);
    stream_open(&r->err, err_pipe[0], STDERR_FILENO, rank);
    return 0;

fail_out_pipe:
    close_pipe(out_pipe);
    return -1;
}

/* ---- rank output ---- */

/* One write per line, so lines of different ranks never mix mid-line. With a
 * prefix, a piece without its newline (split, or last) gets one, so that the
 * next line starts with its own prefix. */
static void emit_line(struct job *job, const struct rank_stream *stream, const char *text,
                      size_t len)
{
    char *out = job->line_out;
    size_t used = 0;
    if (job->opt.prefix)
        used = (size_t)snprintf(out, PREFIX_SIZE, "[%*d] ", job->prefix_width, stream->rank);
    memcpy(out + used, text, len);
    used += len;
    if (job->opt.prefix && (len == 0 || text[len - 1] != '\n'))
        out[used++] = '\n';
    /* If weftrun's own output is gone, the output is dropped: the ranks
     * still have to be supervised. */
    (void)write_all(stream->out_fd, out, used);
}

static void stream_emit_lines(struct job *job, struct rank_stream *stream)
{
    size_t start = 0;
    char *newline;
    while ((newline = memchr(stream->buf + start, '\n', stream->len - start))) {
        size_t end = (size_t)(newline - stream->buf) + 1;
        emit_line(job, stream, stream->buf + start, end - start);
        start = end;
    }
    if (start == 0 && stream->len == sizeof stream->buf) { /* a line too long */
        emit_line(job, stream, stream->buf, stream->len);
        start = stream->len;
    }
    memmove(stream->buf, stream->buf + start, stream->len - start);
    stream->len -= start;
}

static void stream_close(struct job *job, struct rank_stream *stream)
{
    if (stream->fd < 0)
        return;
    if (stream->len > 0) /* the last line had no newline */
        emit_line(job, stream, stream->buf, stream->len);
    stream->len = 0;
    close(stream->fd);
    stream->fd = -1;
}

enum read_result { READ_DATA, READ_NOTHING, READ_CLOSED };

static enum read_result stream_read(struct job *job, struct rank_stream *stream)
{
    if (stream->fd < 0)
        return READ_CLOSED;
    ssize_t got = read(stream->fd, stream->buf + stream->len, sizeof stream->buf - stream->len);
    if (got > 0) {
        stream->len += (size_t)got;
        stream_emit_lines(job, stream);
        return READ_DATA;
    }
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
        return READ_NOTHING;
    stream_close(job, stream);
    return READ_CLOSED;
}

/* Takes what an exited rank left in its pipe. Whatever a grandchild writes
 * later is read while other ranks run, and dropped after that: waiting for
 * end of file would wait on the grandchild. */
static void stream_drain(struct job *job, struct rank_stream *stream)
{
    for (int reads = 0; reads < DRAIN_READS_MAX; reads++)
        if (stream_read(job, stream) != READ_DATA)
            return;
}

/* ---- stopping the job ---- */

static void signal_live_ranks(const struct job *job, int sig)
{
    for (int rank = 0; rank < job->opt.nranks; rank++)
        if (job->ranks[rank].live)
            kill(job->ranks[rank].pid, sig);
}

static void stop_job(struct job *job)
{
    if (job->stopping)
        return;
    job->stopping = true;
    job->kill_at = now_s() + KILL_GRACE_S;
    signal_live_ranks(job, SIGTERM);
}

static int exit_code_of(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void report_failure(const struct job *job, int rank, int status)
{
    char how[96];
    if (WIFEXITED(status))
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    say("weftrun: rank %d %s%s\n", rank, how,
        job->live_count > 0 ? "; stopping the other ranks" : "");
}

static void note_rank_exit(struct job *job, int rank, int status)
{
    struct rank *r = &job->ranks[rank];
    r->live = false;
    job->live_count--;
    /* Its last words are in the pipes already: print them before its end. */
    stream_drain(job, &r->out);
    stream_drain(job, &r->err);
    /* Once stopping, ranks are expected to die; only the first failure counts. */
    if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || job->stopping)
        return;
    if (job->opt.elastic && WIFSIGNALED(status)) {
        say("weftrun: rank %d was killed by signal %d (%s); --elastic: the others go on\n", rank,
            WTERMSIG(status), strsignal(WTERMSIG(status)));
        return;
    }
    job->failed = true;
    job->exit_code = exit_code_of(status);
    report_failure(job, rank, status);
    stop_job(job);
}

static int rank_of_pid(const struct job *job, pid_t pid)
{
    for (int rank = 0; rank < job->opt.nranks; rank++)
        if (job->ranks[rank].live && job->ranks[rank].pid == pid)
            return rank;
    return -1;
}

static void reap_ranks(struct job *job)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        int rank = rank_of_pid(job, pid);
        /* Other children can exist: whoever exec'd weftrun may have left some. */
        if (rank >= 0)
            note_rank_exit(job, rank, status);
    }
}

static void forward_received_signals(const struct job *job)
{
    unsigned char received[64];
    ssize_t got;
    while ((got = read(signals.pipe_read, received, sizeof received)) > 0)
        for (ssize_t i = 0; i < got; i++)
            if (received[i] != SIGCHLD) /* that one only wakes the loop to reap */
                signal_live_ranks(job, received[i]);
}

static void enforce_deadlines(struct job *job)
{
    double now = now_s();
    if (!job->stopping && job->opt.timeout_s > 0 &&
        now >= job->started_at + job->opt.timeout_s) {
        job->timed_out = true;
        say("weftrun: the job ran past its --timeout of %g s; stopping all ranks\n",
            job->opt.timeout_s);
        stop_job(job);
    } else if (job->stopping && !job->killed && now >= job->kill_at) {
        job->killed = true;
        say("weftrun: %d rank(s) still running %d s after SIGTERM; sending SIGKILL\n",
            job->live_count, KILL_GRACE_S);
        signal_live_ranks(job, SIGKILL);
    }
}

/* ---- the loop ---- */

static int poll_timeout_ms(const struct job *job)
{
    double deadline;
    if (job->stopping && !job->killed)
        deadline = job->kill_at;
    else if (!job->stopping && job->opt.timeout_s > 0)
        deadline = job->started_at + job->opt.timeout_s;
    else
        return -1;
    double wait_ms = (deadline - now_s()) * 1000.0 + 1.0; /* +1: never wake early */
    if (wait_ms < 0)
        return 0;
    return wait_ms > INT_MAX ? INT_MAX : (int)wait_ms;
}

static nfds_t collect_poll_fds(struct job *job)
{
    nfds_t count = 0;
    job->pollfds[count++] = (struct pollfd){.fd = signals.pipe_read, .events = POLLIN};
    for (int rank = 0; rank < job->opt.nranks; rank++) {
        struct rank_stream *streams[] = {&job->ranks[rank].out, &job->ranks[rank].err};
        for (size_t i = 0; i < COUNT_OF(streams); i++) {
            if (streams[i]->fd < 0)
                continue;
            job->polled[count] = streams[i];
            job->pollfds[count++] = (struct pollfd){.fd = streams[i]->fd, .events = POLLIN};
        }
    }
    return count;
}

/* One read per ready stream and turn, so a chatty rank cannot starve the rest. */
static void read_ready_streams(struct job *job, nfds_t count)
{
    for (nfds_t i = 1; i < count; i++)
        if (job->pollfds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))
            stream_read(job, job->polled[i]);
}

/* poll itself failed: nothing can be supervised any more. */
static void abandon_job(struct job *job, int poll_errno)
{
    say("weftrun: poll failed: %s; killing all ranks\n", strerror(poll_errno));
    signal_live_ranks(job, SIGKILL);
    for (int rank = 0; rank < job->opt.nranks; rank++)
        if (job->ranks[rank].live && waitpid(job->ranks[rank].pid, NULL, 0) > 0)
            job->ranks[rank].live = false;
    job->live_count = 0;
    job->failed = true;
    job->exit_code = EXIT_INTERNAL;
}

static void run_job(struct job *job)
{
    while (job->live_count > 0) {
        nfds_t count = collect_poll_fds(job);
        if (poll(job->pollfds, count, poll_timeout_ms(job)) < 0 && errno != EINTR) {
            abandon_job(job, errno);
            break;
        }
        forward_received_signals(job);
        read_ready_streams(job, count);
        reap_ranks(job);
        enforce_deadlines(job);
    }
    for (int rank = 0; rank < job->opt.nranks; rank++) {
        stream_close(job, &job->ranks[rank].out);
        stream_close(job, &job->ranks[rank].err);
    }
}

static void start_ranks(struct job *job)
{
    for (int rank = 0; rank < job->opt.nranks; rank++)
        job->ranks[rank].out.fd = job->ranks[rank].err.fd = -1;
    job->started_at = now_s();
    for (int rank = 0; rank < job->opt.nranks; rank++) {
        if (spawn_rank(job, rank) == 0)
            continue;
        say("weftrun: cannot start rank %d: %s%s\n", rank, strerror(errno),
            job->live_count > 0 ? "; stopping the other ranks" : "");
        job->failed = true;
        job->exit_code = EXIT_INTERNAL;
        stop_job(job);
        return;
    }
}

static int prepare_job(struct job *job)
{
    size_t slots = 1 + 2 * (size_t)job->opt.nranks;
    job->ranks = calloc((size_t)job->opt.nranks, sizeof *job->ranks);
    job->pollfds = calloc(slots, sizeof *job->pollfds);
    job->polled = calloc(slots, sizeof *job->polled);
    if (!job->ranks || !job->pollfds || !job->polled) {
        say("weftrun: out of memory for %d ranks\n", job->opt.nranks);
        return -1;
    }
    job->prefix_width = decimal_digits(job->opt.nranks - 1);
    if (install_signal_handlers() != 0) {
        say("weftrun: cannot create the signal pipe: %s\n", strerror(errno));
        return -1;
    }
    raise_fd_limit(job);
    choose_bind_cpus(job);
    if (choose_rendezvous(job) != 0) {
        say("weftrun: cannot choose a rendezvous port: %s\n", strerror(errno));
        return -1;
    }
    if (choose_auth_token() != 0) {
        say("weftrun: cannot make a job token: %s\n", strerror(errno));
        return -1;
    }
    if (choose_job_id() != 0) {
        say("weftrun: cannot make a job id: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static int run_launcher(struct job *job, int argc, char **argv)
{
    switch (parse_options(argc, argv, &job->opt)) {
    case PARSE_HELP:
        print_usage(stdout);
        return 0;
    case PARSE_BAD:
        print_usage(stderr);
        return EXIT_USAGE;
    case PARSE_RUN:
        break;
    }
    keep_standard_fds_open();
    if (prepare_job(job) != 0)
        return EXIT_INTERNAL;
    start_ranks(job);
    run_job(job);
    if (job->timed_out)
        return EXIT_TIMEOUT;
    return job->failed ? job->exit_code : 0;
}

int main(int argc, char **argv)
{
    struct job *job = calloc(1, sizeof *job);
    if (!job)
        return EXIT_INTERNAL;
    int exit_code = run_launcher(job, argc, argv);
    /* Freed so that leak checkers running weftrun report only real leaks. */
    free(job->ranks);
    free(job->pollfds);
    free(job->polled);
    free(job->master_addr);
    free(job);
    return exit_code;
}
