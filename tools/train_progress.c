/* Progress display of `dtrain train`.
 *
 * On a terminal: one line per epoch redrawn in place (carriage return, at
 * most 10 times a second): epoch, a bar, step/total, loss, samples/s, ETA.
 * The finished epoch's line stays. Not a terminal: a plain line every
 * log_every optimizer steps (counted across epochs, as DeepSpeed's
 * steps_per_print) and at the end of the epoch, which reads well in logs and
 * CI output. "Terminal" is dt__progress_terminal's answer: under a launcher
 * only its DT_STDOUT_TTY hint counts, so no \r or escape code ever reaches a
 * file or a pipe (--progress bar there prints plain lines too). */
#include "train.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

char *dt__fmt_duration(double s, char *buf, size_t n)
{
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "--:--");
        return buf;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* A rate with the digits that matter: "11299", "48.2", "0.52". */
static const char *fmt_rate(double r, char *buf, size_t n)
{
    snprintf(buf, n, r >= 100 || r <= 0 ? "%.0f" : "%.3g", r);
    return buf;
}

bool dt__progress_terminal(FILE *out)
{
    /* Under a launcher the rank's own stdout says nothing about the user's:
     * dtrain run gives it a pipe, mpirun often a pty even when its output
     * goes to a file. Only the launcher knows; dtrain run says so in
     * DT_STDOUT_TTY=1, and without that hint a rank prints plain lines. */
    const char *hint = getenv("DT_STDOUT_TTY");
    if (hint && *hint)
        return !strcmp(hint, "1");
    static const char *const launched[] = {"DT_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                           "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof launched / sizeof launched[0]; i++)
        if (getenv(launched[i]))
            return false;
    return isatty(fileno(out));
}

void dt__progress_init(dt__progress *p, const char *mode, FILE *out, int64_t epochs, int64_t log_every)
{
    memset(p, 0, sizeof *p);
    p->out = out;
    p->epochs = epochs;
    p->log_every = log_every > 0 ? log_every : 100;
    bool tty = dt__progress_terminal(out);
    if (!strcmp(mode, "none"))
        p->mode = DT__PROGRESS_NONE;
    else if (!strcmp(mode, "plain") || !tty) /* never a bar (\r, escapes) into a file or pipe */
        p->mode = DT__PROGRESS_PLAIN;
    else
        p->mode = DT__PROGRESS_BAR;
    p->width = 80;
    struct winsize ws;
    if (tty && ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
        p->width = ws.ws_col;
}

void dt__progress_set_rates(dt__progress *p, int64_t tokens_per_sample, double flops_per_sample, double peak_gflops)
{
    p->tokens_per_sample = tokens_per_sample;
    p->flops_per_sample = flops_per_sample;
    p->peak_gflops = peak_gflops;
}

/* " tokens/s 1234 MFU 41.2%" for language models, "" otherwise. */
static const char *rates(const dt__progress *p, double sps, char *buf, size_t cap)
{
    buf[0] = 0;
    if (p->tokens_per_sample > 0) {
        int n = snprintf(buf, cap, " tokens/s %.0f", sps * (double)p->tokens_per_sample);
        if (p->flops_per_sample > 0 && p->peak_gflops > 0 && n > 0 && (size_t)n < cap)
            snprintf(buf + n, cap - (size_t)n, " MFU %.1f%%", 100.0 * sps * p->flops_per_sample * 1e-9 / p->peak_gflops);
    }
    return buf;
}

void dt__progress_epoch_begin(dt__progress *p, int64_t epoch, int64_t total_steps)
{
    p->epoch = epoch;
    p->total = total_steps;
    p->t0 = dt_time_s();
    p->last_draw = 0;
    p->drawn = false;
}

static void draw_bar(dt__progress *p, int64_t step, double loss, double sps, double eta, bool final)
{
    char tail[200], etas[32], head[48], lm[64];
    snprintf(head, sizeof head, "epoch %lld/%lld ", (long long)p->epoch + 1, (long long)p->epochs);
    char rate[32];
    snprintf(tail, sizeof tail, " %lld/%lld loss %.4f %s samples/s%s %s %s", (long long)step,
             (long long)p->total, loss, fmt_rate(sps, rate, sizeof rate), rates(p, sps, lm, sizeof lm),
             final ? "took" : "ETA",
             dt__fmt_duration(final ? dt_time_s() - p->t0 : eta, etas, sizeof etas));
    int barw = p->width - 1 - (int)strlen(head) - (int)strlen(tail) - 2;
    if (barw > 40)
        barw = 40;
    char bar[64];
    int fill = 0;
    if (barw < 5)
        barw = 0;
    if (barw > 0) {
        fill = p->total > 0 ? (int)((double)barw * (double)step / (double)p->total) : barw;
        for (int i = 0; i < barw; i++)
            bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
        bar[barw] = 0;
        fprintf(p->out, "\r%s[%s]%s\033[K", head, bar, tail);
    } else {
        fprintf(p->out, "\r%s%s\033[K", head, tail);
    }
    fflush(p->out);
    p->drawn = true;
}

void dt__progress_step(dt__progress *p, int64_t step, int64_t global_step, double loss, double lr, int64_t samples)
{
    if (p->mode == DT__PROGRESS_NONE)
        return;
    double now = dt_time_s(), el = now - p->t0;
    double sps = el > 0 ? (double)samples / el : 0;
    if (p->mode == DT__PROGRESS_PLAIN) {
        if (global_step % p->log_every == 0 && step != p->total) {
            char etas[32];
            double eta = step > 0 ? el * (double)(p->total - step) / (double)step : -1;
            char rate[32], lm[64];
            fprintf(p->out, "epoch %lld/%lld step %lld/%lld loss %.4f lr %.4g samples/s %s%s ETA %s\n",
                    (long long)p->epoch + 1, (long long)p->epochs, (long long)step,
                    (long long)p->total, loss, lr, fmt_rate(sps, rate, sizeof rate), rates(p, sps, lm, sizeof lm),
                    dt__fmt_duration(eta, etas, sizeof etas));
            fflush(p->out);
        }
        return;
    }
    if (now - p->last_draw < 0.1 && step != p->total)
        return;
    p->last_draw = now;
    double eta = step > 0 ? el * (double)(p->total - step) / (double)step : -1;
    draw_bar(p, step, loss, sps, eta, false);
}

void dt__progress_exclude(dt__progress *p, double seconds)
{
    if (seconds > 0)
        p->t0 += seconds;
}

void dt__progress_clear(dt__progress *p)
{
    if (p->mode == DT__PROGRESS_BAR && p->drawn) {
        fprintf(p->out, "\r\033[K");
        fflush(p->out);
        p->drawn = false;
    }
}

void dt__progress_epoch_end(dt__progress *p, int64_t steps, double loss, double wall_s,
                            double samples_per_s)
{
    if (p->mode == DT__PROGRESS_NONE)
        return;
    if (p->mode == DT__PROGRESS_BAR) {
        draw_bar(p, steps, loss, samples_per_s, 0, true);
        fputc('\n', p->out);
        p->drawn = false;
    } else {
        char rate[32], lm[64];
        fprintf(p->out, "epoch %lld/%lld done: %lld steps, loss %.4f, %.2f s, %s samples/s%s\n",
                (long long)p->epoch + 1, (long long)p->epochs, (long long)steps, loss, wall_s,
                fmt_rate(samples_per_s, rate, sizeof rate), rates(p, samples_per_s, lm, sizeof lm));
    }
    fflush(p->out);
}
