/* Base layer: dt_file never follows a symlink, and a file appears at its
 * name complete or not at all. */
#include "dtrain/base.h"
#include "test.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static char g_dir[64];

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* The file's content, or "" when it cannot be read. */
static const char *slurp(const char *path)
{
    static char buf[256];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return buf;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    buf[k] = 0;
    fclose(f);
    return buf;
}

/* Files in g_dir whose name contains ".tmp-" (left-behind temporaries). */
static int count_temps(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".tmp-") != NULL;
    closedir(d);
    return n;
}

TEST(atomic_write_replaces_whole_file)
{
    char p[128];
    path_in(p, sizeof p, "a.txt");
    put(p, "old");
    ASSERT_OK(dt_file_write_atomic(p, "new contents", 12, 0644));
    ASSERT_STR_EQ(slurp(p), "new contents");
    ASSERT_EQ_INT(count_temps(), 0);
}

TEST(uncommitted_file_leaves_old_one)
{
    char p[128];
    path_in(p, sizeof p, "b.txt");
    put(p, "old");
    dt_file *f;
    ASSERT_OK(dt_file_open(p, 0644, &f));
    ASSERT_OK(dt_file_write(f, "half", 4));
    ASSERT_STR_EQ(slurp(p), "old");
    ASSERT_EQ_INT(count_temps(), 1);
    ASSERT_OK(dt_file_close(f));
    ASSERT_STR_EQ(slurp(p), "old");
    ASSERT_EQ_INT(count_temps(), 0);
}

TEST(live_file_visible_while_written)
{
    char p[128];
    path_in(p, sizeof p, "c.log");
    dt_file *f;
    ASSERT_OK(dt_file_open(p, 0644, &f));
    ASSERT_OK(dt_file_commit(f));
    ASSERT_OK(dt_file_write(f, "line 1\n", 7));
    ASSERT_STR_EQ(slurp(p), "line 1\n");
    ASSERT_OK(dt_file_write(f, "line 2\n", 7));
    ASSERT_STR_EQ(slurp(p), "line 1\nline 2\n");
    ASSERT_OK(dt_file_close(f));
    ASSERT_EQ_INT(count_temps(), 0);
    struct stat st;
    ASSERT_EQ_INT(stat(p, &st), 0);
    mode_t um = umask(0);
    umask(um);
    ASSERT_EQ_INT((int)(st.st_mode & 0777), (int)(0644 & ~um)); /* the mode given, not mkstemp's 0600 */
}

TEST(symlink_refused_target_unchanged)
{
    char target[128], link[128];
    path_in(target, sizeof target, "victim");
    path_in(link, sizeof link, "planted");
    put(target, "precious");
    ASSERT_EQ_INT(symlink(target, link), 0);
    dt_file *f = NULL;
    ASSERT_STATUS(dt_file_open(link, 0644, &f), DT_ERR_IO);
    ASSERT(f == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "symbolic link");
    ASSERT_STR_CONTAINS(dt_last_error(), link);
    ASSERT_STATUS(dt_file_write_atomic(link, "x", 1, 0644), DT_ERR_IO);
    int fd = 7;
    ASSERT_STATUS(dt_file_create_excl(link, 0644, &fd), DT_ERR_IO);
    ASSERT_EQ_INT(fd, -1);
    ASSERT_STR_CONTAINS(dt_last_error(), "symbolic link");
    char from[128];
    path_in(from, sizeof from, "from");
    put(from, "data");
    ASSERT_STATUS(dt_file_rename(from, link), DT_ERR_IO);
    ASSERT_STR_EQ(slurp(target), "precious");
    struct stat st;
    ASSERT_EQ_INT(lstat(link, &st), 0);
    ASSERT(S_ISLNK(st.st_mode));
    ASSERT_EQ_INT(count_temps(), 0);
    /* a dangling link (target absent) is not followed either */
    unlink(target);
    ASSERT_STATUS(dt_file_write_atomic(link, "x", 1, 0644), DT_ERR_IO);
    ASSERT_EQ_INT(access(target, F_OK), -1);
    unlink(link);
    unlink(from);
}

TEST(symlink_appearing_before_commit_refused)
{
    char target[128], p[128];
    path_in(target, sizeof target, "victim2");
    path_in(p, sizeof p, "late");
    put(target, "precious");
    dt_file *f;
    ASSERT_OK(dt_file_open(p, 0644, &f));
    ASSERT_OK(dt_file_write(f, "x", 1));
    ASSERT_EQ_INT(symlink(target, p), 0);
    ASSERT_STATUS(dt_file_commit(f), DT_ERR_IO);
    ASSERT_OK(dt_file_close(f));
    ASSERT_STR_EQ(slurp(target), "precious");
    ASSERT_EQ_INT(count_temps(), 0);
    unlink(p);
    unlink(target);
}

/* Whether path is still what kind says (S_IFIFO, S_IFCHR, S_IFDIR). */
static bool still(const char *path, mode_t kind)
{
    struct stat st;
    return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

/* A name that holds a FIFO, a directory or (as root) a device node is refused
 * by every writer: rename(2) would replace the FIFO or the device with the
 * file (as root, `--metrics /dev/null` once replaced /dev/null itself). The
 * device is a node of our own in the test's directory, never /dev/null. */
TEST(non_regular_target_refused_and_kept)
{
    char fifo[128], dev[128], dir[128], from[128];
    path_in(fifo, sizeof fifo, "fifo");
    path_in(dev, sizeof dev, "null-node");
    path_in(dir, sizeof dir, "a-dir");
    path_in(from, sizeof from, "from-file");
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    ASSERT_EQ_INT(mkdir(dir, 0700), 0);
    const bool have_dev = mknod(dev, S_IFCHR | 0600, makedev(1, 3)) == 0; /* root only */
    const char *names[] = {fifo, dir, dev};
    const char *kinds[] = {"a FIFO", "a directory", "a character device"};
    const mode_t modes[] = {S_IFIFO, S_IFDIR, S_IFCHR};
    for (int i = 0; i < (have_dev ? 3 : 2); i++) {
        dt_file *f = NULL;
        ASSERT_STATUS(dt_file_open(names[i], 0644, &f), DT_ERR_IO);
        ASSERT(f == NULL);
        ASSERT_STR_CONTAINS(dt_last_error(), names[i]);
        ASSERT_STR_CONTAINS(dt_last_error(), kinds[i]);
        ASSERT_STATUS(dt_file_write_atomic(names[i], "x", 1, 0644), DT_ERR_IO);
        ASSERT_STATUS(dt_file_check_target(names[i]), DT_ERR_IO);
        ASSERT_STR_CONTAINS(dt_last_error(), kinds[i]);
        put(from, "data");
        ASSERT_STATUS(dt_file_rename(from, names[i]), DT_ERR_IO);
        ASSERT(still(names[i], modes[i]));
        ASSERT_STR_EQ(slurp(from), "data");
    }
    /* one that appears at the name between open and commit (the metrics file's rename comes at the run's end) */
    char late[128];
    path_in(late, sizeof late, "late-fifo");
    dt_file *f;
    ASSERT_OK(dt_file_open(late, 0644, &f));
    ASSERT_OK(dt_file_write(f, "x", 1));
    ASSERT_EQ_INT(mkfifo(late, 0600), 0);
    ASSERT_STATUS(dt_file_commit(f), DT_ERR_IO);
    ASSERT_OK(dt_file_close(f));
    ASSERT(still(late, S_IFIFO));
    ASSERT_EQ_INT(count_temps(), 0);
    /* what may be there: nothing, a regular file; a directory renamed over an empty directory (checkpoints) */
    char reg[128], d2[128];
    path_in(reg, sizeof reg, "regular");
    path_in(d2, sizeof d2, "a-dir2");
    put(reg, "old");
    ASSERT_OK(dt_file_check_target(reg));
    ASSERT_OK(dt_file_write_atomic(reg, "new", 3, 0644));
    ASSERT_STR_EQ(slurp(reg), "new");
    ASSERT_EQ_INT(mkdir(d2, 0700), 0);
    ASSERT_OK(dt_file_rename(d2, dir));
    ASSERT(still(dir, S_IFDIR));
    ASSERT_STATUS(dt_file_rename(reg, dir), DT_ERR_IO); /* a file over a directory */
    ASSERT_STATUS(dt_file_check_target(""), DT_ERR_INVALID_ARG);
    unlink(fifo), unlink(late), unlink(dev), unlink(from), unlink(reg), rmdir(dir);
}

TEST(create_excl)
{
    char p[128];
    path_in(p, sizeof p, "excl");
    int fd;
    ASSERT_OK(dt_file_create_excl(p, 0600, &fd));
    ASSERT(fd >= 0);
    ASSERT_EQ_INT((int)write(fd, "1", 1), 1);
    close(fd);
    ASSERT_STATUS(dt_file_create_excl(p, 0600, &fd), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "exists");
    ASSERT_STR_EQ(slurp(p), "1");
}

TEST(rename_and_errors)
{
    char a[128], b[128];
    path_in(a, sizeof a, "r1");
    path_in(b, sizeof b, "r2");
    put(a, "A");
    put(b, "B");
    ASSERT_OK(dt_file_rename(a, b));
    ASSERT_STR_EQ(slurp(b), "A");
    ASSERT_EQ_INT(access(a, F_OK), -1);
    ASSERT_STATUS(dt_file_rename(a, b), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), a);
    dt_file *f;
    ASSERT_STATUS(dt_file_open("/nonexistent-dir-dtrain/x", 0644, &f), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent-dir-dtrain/x");
    ASSERT_STATUS(dt_file_open("", 0644, &f), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_file_close(NULL));
    ASSERT_EQ_INT(dt_file_fd(NULL), -1);
}

TEST(path_trim_slashes)
{
    char b[8];
    ASSERT_OK(dt_path_trim_slashes("out///", b, sizeof b));
    ASSERT_STR_EQ(b, "out");
    ASSERT_OK(dt_path_trim_slashes("a/b", b, sizeof b));
    ASSERT_STR_EQ(b, "a/b");
    ASSERT_OK(dt_path_trim_slashes("//", b, sizeof b));
    ASSERT_STR_EQ(b, "/");
    ASSERT_OK(dt_path_trim_slashes("", b, sizeof b));
    ASSERT_STR_EQ(b, "");
    ASSERT_OK(dt_path_trim_slashes("1234567/", b, sizeof b)); /* 7 bytes and the NUL fit */
    ASSERT_STR_EQ(b, "1234567");
    ASSERT_STATUS(dt_path_trim_slashes("12345678", b, sizeof b), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "too long");
    ASSERT_STATUS(dt_path_trim_slashes(NULL, b, sizeof b), DT_ERR_NULL);
}

/* dt_dir_lock: one holder at a time (a second open file, in this process too, is refused with DT_ERR_STATE
 * and leaves no descriptor), let go at close; a symlink or a file is not a directory to hold. */
TEST(dir_lock_one_holder)
{
    char d[256], l[256], f[256];
    path_in(d, sizeof d, "lockdir");
    path_in(l, sizeof l, "lockdir-link");
    path_in(f, sizeof f, "lockdir-file");
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    ASSERT_EQ_INT(symlink(d, l), 0);
    int fd = -1, fd2 = 7;
    ASSERT_OK(dt_dir_lock(d, &fd));
    ASSERT(fd >= 0);
    ASSERT_STATUS(dt_dir_lock(d, &fd2), DT_ERR_STATE);
    ASSERT_EQ_INT(fd2, -1);
    ASSERT_STR_CONTAINS(dt_last_error(), "another job");
    ASSERT_STATUS(dt_dir_lock(l, &fd2), DT_ERR_INVALID_ARG); /* not through the link */
    ASSERT_STR_CONTAINS(dt_last_error(), "symlink");
    close(fd);
    ASSERT_OK(dt_dir_lock(d, &fd2));
    close(fd2);
    int w = open(f, O_WRONLY | O_CREAT, 0644);
    ASSERT(w >= 0);
    close(w);
    ASSERT_STATUS(dt_dir_lock(f, &fd2), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a directory");
}

/* dt_dir_make_parent: the missing directories above a path, not the path itself; a symlink among them refused. */
TEST(dir_make_parent)
{
    char p[256], q[256];
    path_in(p, sizeof p, "mp/a/b/out.json");
    ASSERT_OK(dt_dir_make_parent(p));
    struct stat sb;
    path_in(q, sizeof q, "mp/a/b");
    ASSERT(lstat(q, &sb) == 0 && S_ISDIR(sb.st_mode));
    ASSERT(lstat(p, &sb) != 0); /* the path itself is not made */
    path_in(p, sizeof p, "mp/a/c/"); /* trailing slashes aside: c's parent only */
    ASSERT_OK(dt_dir_make_parent(p));
    path_in(q, sizeof q, "mp/a/c");
    ASSERT(lstat(q, &sb) != 0);
    ASSERT_OK(dt_dir_make_parent("name-without-a-directory"));
    ASSERT_OK(dt_dir_make_parent("/name-at-the-root"));
    path_in(q, sizeof q, "mp/link");
    path_in(p, sizeof p, "mp/a");
    ASSERT_EQ_INT(symlink(p, q), 0);
    path_in(p, sizeof p, "mp/link/out.json");
    ASSERT_STATUS(dt_dir_make_parent(p), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "symlink");
    ASSERT_STATUS(dt_dir_make_parent(""), DT_ERR_INVALID_ARG);
}

static bool is_dir(const char *p)
{
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* dt_dir_hold: made with its missing parents and held (a second holder refused, DT_ERR_STATE, its directory
 * left alone); close(h, false) keeps what was made; close(h, true) removes what open made while it is empty and
 * still the directory held: never a parent that was there before, a filled one, or one that replaced it. */
TEST(dir_hold)
{
    char base[256], d[256], p[256];
    path_in(base, sizeof base, "hold");
    ASSERT_EQ_INT(mkdir(base, 0755), 0);
    path_in(d, sizeof d, "hold/a/b/c/");
    dt_dir_hold *h = NULL, *h2 = (dt_dir_hold *)1;
    ASSERT_OK(dt_dir_hold_open(d, &h));
    path_in(p, sizeof p, "hold/a/b/c");
    ASSERT_STR_EQ(dt_dir_hold_path(h), p);
    ASSERT(is_dir(p) && dt_dir_hold_same(h));
    ASSERT_STATUS(dt_dir_hold_open(p, &h2), DT_ERR_STATE);
    ASSERT(h2 == NULL && is_dir(p)); /* the refused one removed nothing */
    ASSERT_STR_CONTAINS(dt_last_error(), "another job");
    dt_dir_hold_close(h, true); /* all three levels made here, all empty: gone, the base stays */
    path_in(p, sizeof p, "hold/a");
    ASSERT(!is_dir(p) && is_dir(base));

    /* a parent that was there stays; a filled directory stays */
    path_in(d, sizeof d, "hold/x/y");
    ASSERT_OK(dt_dir_hold_open(d, &h));
    dt_dir_hold_close(h, false); /* kept */
    ASSERT(is_dir(d));
    ASSERT_EQ_INT(rmdir(d), 0);
    ASSERT_OK(dt_dir_hold_open(d, &h)); /* now only y is made */
    dt_dir_hold_close(h, true);
    path_in(p, sizeof p, "hold/x");
    ASSERT(!is_dir(d) && is_dir(p));
    ASSERT_OK(dt_dir_hold_open(d, &h));
    path_in(p, sizeof p, "hold/x/y/saved");
    put(p, "kept");
    dt_dir_hold_close(h, true);
    ASSERT_STR_EQ(slurp(p), "kept");

    /* replaced after open (renamed aside, a new one made at the name): the new one is not removed */
    path_in(d, sizeof d, "hold/r");
    ASSERT_OK(dt_dir_hold_open(d, &h));
    path_in(p, sizeof p, "hold/r-aside");
    ASSERT_EQ_INT(rename(d, p), 0);
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    ASSERT(!dt_dir_hold_same(h));
    dt_dir_hold_close(h, true);
    ASSERT(is_dir(d) && is_dir(p));

    /* a symlink or a file in the way: refused, nothing made */
    path_in(p, sizeof p, "hold/link");
    ASSERT_EQ_INT(symlink(d, p), 0);
    ASSERT_STATUS(dt_dir_hold_open(p, &h2), DT_ERR_INVALID_ARG);
    ASSERT(h2 == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "symlink");
    path_in(p, sizeof p, "hold/x/y/saved/z");
    ASSERT(dt_dir_hold_open(p, &h2) < 0);
    ASSERT(h2 == NULL);
    dt_dir_hold_close(NULL, true);
    ASSERT(dt_dir_hold_path(NULL) == NULL && !dt_dir_hold_same(NULL));
}

/* The Hugging Face hub cache's layout, REPO/snapshots/REV/NAME -> ../../blobs/HASH: those links are
 * followed (dt_file_read_all reads the blob), every other symlink is refused as before. */
TEST(hf_cache_links)
{
    char repo[128], p[256], q[256], out[4096];
    path_in(repo, sizeof repo, "models--org--m");
    const char *dirs[] = {"", "/blobs", "/snapshots", "/snapshots/rev1", "/elsewhere", "/blobs/sub"};
    for (int i = 0; i < 6; i++) {
        snprintf(p, sizeof p, "%s%s", repo, dirs[i]);
        ASSERT(mkdir(p, 0755) == 0);
    }
    snprintf(p, sizeof p, "%s/blobs/abc", repo);
    put(p, "{\"a\": 1}");
    snprintf(p, sizeof p, "%s/snapshots/rev1/config.json", repo);
    ASSERT(symlink("../../blobs/abc", p) == 0);
    ASSERT(dt_file_hf_cache_link(p, out, sizeof out));
    ASSERT(strstr(out, "/models--org--m/blobs/abc") != NULL);
    char *txt = NULL;
    size_t len = 0;
    ASSERT_OK(dt_file_read_all(p, 100, &txt, &len));
    ASSERT_STR_EQ(txt, "{\"a\": 1}");
    free(txt);
    /* a relative path to the same link */
    char cwd[4096];
    ASSERT(getcwd(cwd, sizeof cwd) != NULL);
    ASSERT(chdir(repo) == 0);
    ASSERT(dt_file_hf_cache_link("snapshots/rev1/config.json", out, sizeof out));
    ASSERT(chdir("snapshots/rev1") == 0);
    ASSERT(!dt_file_hf_cache_link("config.json", out, sizeof out)); /* "." is not named snapshots/REV */
    ASSERT(chdir(cwd) == 0);
    /* a link to that link still ends in the repository's blob: taken */
    snprintf(p, sizeof p, "%s/snapshots/rev1/again.json", repo);
    ASSERT(symlink("config.json", p) == 0);
    ASSERT(dt_file_hf_cache_link(p, out, sizeof out));
    /* not the cache's: a link out of the repository, into a subdirectory of blobs/, to a directory, from a
       directory not under snapshots/, and a regular file */
    struct {
        const char *name, *target;
    } bad[] = {{"snapshots/rev1/out.json", "../../elsewhere/x"}, {"snapshots/rev1/sub.json", "../../blobs/sub/y"},
               {"snapshots/rev1/dir.json", "../../blobs/sub"},   {"elsewhere/z.json", "../blobs/abc"}};
    snprintf(p, sizeof p, "%s/elsewhere/x", repo);
    put(p, "x");
    snprintf(p, sizeof p, "%s/blobs/sub/y", repo);
    put(p, "y");
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", repo, bad[i].name);
        ASSERT(symlink(bad[i].target, p) == 0);
        ASSERT(!dt_file_hf_cache_link(p, out, sizeof out));
        ASSERT_STATUS(dt_file_read_all(p, 100, &txt, &len), DT_ERR_IO);
        ASSERT_STR_CONTAINS(dt_last_error(), "symlink");
    }
    snprintf(q, sizeof q, "%s/blobs/abc", repo);
    ASSERT(!dt_file_hf_cache_link(q, out, sizeof out)); /* not a link */
    ASSERT(!dt_file_hf_cache_link(p, out, 8));          /* no room */
    snprintf(p, sizeof p, "rm -rf '%s'", repo);
    ASSERT(system(p) == 0);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-file-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(atomic_write_replaces_whole_file);
    RUN(uncommitted_file_leaves_old_one);
    RUN(live_file_visible_while_written);
    RUN(symlink_refused_target_unchanged);
    RUN(symlink_appearing_before_commit_refused);
    RUN(non_regular_target_refused_and_kept);
    RUN(create_excl);
    RUN(rename_and_errors);
    RUN(path_trim_slashes);
    RUN(dir_make_parent);
    RUN(dir_lock_one_holder);
    RUN(dir_hold);
    RUN(hf_cache_links);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
