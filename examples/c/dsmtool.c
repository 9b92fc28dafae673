/* dsmtool: a scriptable System V shared-memory client, for trying the
 * Mirage DSM by hand and for its fault-injection tests.
 *
 *   dsmtool KEY OP...
 *     c N     create KEY with N pages (IPC_CREAT) and attach it
 *     g       get KEY (waiting up to 10 s for it to exist) and attach it
 *     w P V   write V into page P (words 0 and 1: value and its copy)
 *     r P     read page P and print "r P V" (exit 3 if the copy is torn)
 *     R P     timed read: print "R P V T0 T1", T0 and T1 CLOCK_MONOTONIC ns
 *             around the access (for the fault tests' history checks)
 *     T P V   timed write: print "T P V T0 T1" once the write is done
 *     W P V   wait (up to 20 s) until page P holds V, then print "W P V"
 *     s MS    sleep MS milliseconds
 *     p TEXT  print TEXT
 *     f       fork: the child runs the remaining ops; the parent waits
 *             for it and exits with its status
 *     d       detach
 *
 * Every line is flushed at once. Under the shim, a page whose only copy
 * died with its site gives SIGBUS on access (coherence before
 * availability); without mmulab this runs on the kernel's segments.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s KEY OP...\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    key_t key = (key_t)strtol(argv[1], NULL, 0);
    volatile char *base = NULL;
    int shmid = -1;
    for (int i = 2; i < argc; i++) {
        const char *op = argv[i];
        if (!strcmp(op, "c") && i + 1 < argc) {
            int pages = atoi(argv[++i]);
            shmid = shmget(key, (size_t)pages * PAGE, IPC_CREAT | 0600);
        } else if (!strcmp(op, "g")) {
            for (int t = 0; (shmid = shmget(key, PAGE, 0600)) < 0 && errno == ENOENT && t < 1000; t++)
                usleep(10000);
        } else if (!strcmp(op, "w") && i + 2 < argc) {
            int p = atoi(argv[++i]);
            long v = atol(argv[++i]);
            volatile long *w = (volatile long *)(base + (size_t)p * PAGE);
            w[0] = v;
            w[1] = v;
            continue;
        } else if (!strcmp(op, "r") && i + 1 < argc) {
            int p = atoi(argv[++i]);
            volatile long *w = (volatile long *)(base + (size_t)p * PAGE);
            long v = w[0], v2 = w[1];
            printf("r %d %ld\n", p, v);
            if (v != v2) {
                printf("torn page %d: %ld %ld\n", p, v, v2);
                return 3;
            }
            continue;
        } else if (!strcmp(op, "R") && i + 1 < argc) {
            int p = atoi(argv[++i]);
            volatile long *w = (volatile long *)(base + (size_t)p * PAGE);
            long long t0 = now_ns();
            long v = w[0], v2 = w[1];
            long long t1 = now_ns();
            if (v != v2) {
                printf("torn page %d: %ld %ld\n", p, v, v2);
                return 3;
            }
            printf("R %d %ld %lld %lld\n", p, v, t0, t1);
            continue;
        } else if (!strcmp(op, "T") && i + 2 < argc) {
            int p = atoi(argv[++i]);
            long v = atol(argv[++i]);
            volatile long *w = (volatile long *)(base + (size_t)p * PAGE);
            long long t0 = now_ns();
            w[0] = v;
            w[1] = v;
            long long t1 = now_ns();
            printf("T %d %ld %lld %lld\n", p, v, t0, t1);
            continue;
        } else if (!strcmp(op, "W") && i + 2 < argc) {
            int p = atoi(argv[++i]);
            long v = atol(argv[++i]);
            volatile long *w = (volatile long *)(base + (size_t)p * PAGE);
            int t = 0;
            while (w[0] != v && t++ < 20000)
                usleep(1000);
            if (w[0] != v) {
                printf("timeout waiting for page %d = %ld\n", p, v);
                return 4;
            }
            printf("W %d %ld\n", p, v);
            continue;
        } else if (!strcmp(op, "s") && i + 1 < argc) {
            usleep(atoi(argv[++i]) * 1000);
            continue;
        } else if (!strcmp(op, "p") && i + 1 < argc) {
            printf("%s\n", argv[++i]);
            continue;
        } else if (!strcmp(op, "f")) {
            pid_t child = fork();
            if (child < 0) {
                perror("fork");
                return 1;
            }
            if (child > 0) {
                int st = 0;
                waitpid(child, &st, 0);
                if (WIFSIGNALED(st))
                    return 128 + WTERMSIG(st);
                return WEXITSTATUS(st);
            }
            continue;
        } else if (!strcmp(op, "d")) {
            if (shmdt((const void *)base) != 0) {
                perror("shmdt");
                return 1;
            }
            base = NULL;
            continue;
        } else {
            fprintf(stderr, "bad op %s\n", op);
            return 2;
        }
        /* c and g: attach. */
        if (shmid < 0) {
            perror("shmget");
            return 1;
        }
        base = shmat(shmid, NULL, 0);
        if (base == (void *)-1) {
            perror("shmat");
            return 1;
        }
    }
    return 0;
}
