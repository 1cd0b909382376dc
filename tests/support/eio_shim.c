/* A failing disk for the tests (tests/test_disk_faults.py), loaded with LD_PRELOAD.
 *
 * While the file $RALPH_TEST_EIO_FLAG exists, every write under $RALPH_TEST_EIO_PREFIX
 * fails with EIO, as on a disk that went bad: write, pwrite, fsync and fdatasync of a
 * file opened there, and open for writing, rename, link and unlink of a path there.
 * Reads go on. The engine arms it itself at a chosen write (RALPH_TEST_EIO_AT_WRITE);
 * the test heals the disk by removing the flag.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int failing_path(const char *path) {
    const char *flag = getenv("RALPH_TEST_EIO_FLAG");
    const char *prefix = getenv("RALPH_TEST_EIO_PREFIX");
    if (!flag || !prefix || !path)
        return 0;
    if (strncmp(path, prefix, strlen(prefix)) != 0)
        return 0;
    int saved = errno;
    int armed = access(flag, F_OK) == 0;
    errno = saved;
    return armed;
}

static int failing_fd(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int saved = errno;
    ssize_t n = readlink(link, path, sizeof path - 1);
    errno = saved;
    if (n <= 0)
        return 0;
    path[n] = '\0';
    return failing_path(path);
}

#define REAL(name) static __typeof__(name) *real_##name; \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write);
    if (failing_fd(fd)) { errno = EIO; return -1; }
    return real_write(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite);
    if (failing_fd(fd)) { errno = EIO; return -1; }
    return real_pwrite(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite64);
    if (failing_fd(fd)) { errno = EIO; return -1; }
    return real_pwrite64(fd, buf, count, offset);
}

int fsync(int fd) {
    REAL(fsync);
    if (failing_fd(fd)) { errno = EIO; return -1; }
    return real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (failing_fd(fd)) { errno = EIO; return -1; }
    return real_fdatasync(fd);
}

static int writes(int flags) {
    return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)) != 0;
}

static int opening(const char *path, int flags) {
    if (writes(flags) && failing_path(path)) { errno = EIO; return 1; }
    return 0;
}

int open(const char *path, int flags, ...) {
    REAL(open);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    if (opening(path, flags)) return -1;
    return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    REAL(open64);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    if (opening(path, flags)) return -1;
    return real_open64(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    REAL(openat);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    if (path[0] == '/' && opening(path, flags)) return -1;
    return real_openat(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    REAL(openat64);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    if (path[0] == '/' && opening(path, flags)) return -1;
    return real_openat64(dirfd, path, flags, mode);
}

int rename(const char *from, const char *to) {
    REAL(rename);
    if (failing_path(to)) { errno = EIO; return -1; }
    return real_rename(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    REAL(renameat);
    if (to[0] == '/' && failing_path(to)) { errno = EIO; return -1; }
    return real_renameat(fromfd, from, tofd, to);
}

int link(const char *from, const char *to) {
    REAL(link);
    if (failing_path(to)) { errno = EIO; return -1; }
    return real_link(from, to);
}

int unlink(const char *path) {
    REAL(unlink);
    if (failing_path(path)) { errno = EIO; return -1; }
    return real_unlink(path);
}

int mkdir(const char *path, mode_t mode) {
    REAL(mkdir);
    if (failing_path(path)) { errno = EIO; return -1; }
    return real_mkdir(path, mode);
}
