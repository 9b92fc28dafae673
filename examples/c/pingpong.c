/* fleisch89 Fig. 4: the ping-pong test, the worst case for Mirage.
 *
 * Two processes on two sites share one page. For each trial, process 1
 * writes CHECKVAL into the first location of an adjacent pair and waits
 * for process 2 to write CHECKVAL+1 into the second; then both move to the
 * next pair. Process 1 ends with ENDVAL. Every access moves the page
 * between sites. sched_yield() plays the role of Locus's yield() (§7.2).
 *
 * An unmodified System V program: run it under the shim,
 *   mmulab dsm run --config cluster.toml --site a -- ./pingpong 1 [trials]
 *   mmulab dsm run --config cluster.toml --site b -- ./pingpong 2
 * (or on one machine with plain System V shared memory, without mmulab).
 *
 * The oracle: at the end both processes check every pair; a stale read
 * would show as a pair not (CHECKVAL, CHECKVAL+1), or as a hang.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <time.h>
#include <unistd.h>

#define KEY 0x4d495247 /* "MIRG" */
#define CHECKVAL 1000
#define ENDVAL (-1)
#define MAXTRIALS 500 /* pairs on one 4 KiB page, plus the end mark */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int site = argc > 1 ? atoi(argv[1]) : 0;
    int trials = argc > 2 ? atoi(argv[2]) : 200;
    if ((site != 1 && site != 2) || trials < 1 || trials > MAXTRIALS) {
        fprintf(stderr, "usage: %s 1|2 [trials <= %d]\n", argv[0], MAXTRIALS);
        return 2;
    }
    int shmid;
    if (site == 1) {
        shmid = shmget(KEY, 4096, IPC_CREAT | 0600);
    } else {
        /* Site 2 waits (bounded) for site 1 to create the segment. */
        for (int tries = 0; (shmid = shmget(KEY, 4096, 0600)) < 0 && errno == ENOENT && tries < 1000; tries++)
            usleep(10000);
    }
    if (shmid < 0) {
        perror("shmget");
        return 1;
    }
    volatile int *addr2 = shmat(shmid, NULL, 0);
    if (addr2 == (void *)-1) {
        perror("shmat");
        return 1;
    }
    volatile int *pint = addr2; /* start of shared memory */
    double t0 = now();
    int cycles = 0;
    if (site == 1) {
        /* Code at Site 1 */
        for (int i = 0; i < trials; i++) {
            *pint++ = CHECKVAL;
            while ((*pint) != CHECKVAL + 1)
                sched_yield();
            pint++;
            cycles++;
        }
        *pint++ = ENDVAL;
    } else {
        /* Code at Site 2 */
        for (;;) {
            if ((*pint) == ENDVAL)
                break;
            if ((*pint) == CHECKVAL) {
                pint++;
                *pint++ = CHECKVAL + 1;
                cycles++;
            }
            sched_yield();
        }
    }
    double secs = now() - t0;
    int bad = 0;
    for (int i = 0; i < cycles; i++)
        if (addr2[2 * i] != CHECKVAL || addr2[2 * i + 1] != CHECKVAL + 1)
            bad++;
    printf("site %d: %d cycles in %.3f s (%.0f cycles/s), %d bad pairs\n", site, cycles, secs,
           secs > 0 ? cycles / secs : 0.0, bad);
    /* Site 2 removes the key once done; the segment dies at the last detach. */
    if (site == 2 && shmctl(shmid, IPC_RMID, NULL) != 0)
        perror("shmctl(IPC_RMID)");
    if (shmdt((const void *)addr2) != 0) {
        perror("shmdt");
        return 1;
    }
    return bad == 0 && cycles == trials ? 0 : 1;
}
