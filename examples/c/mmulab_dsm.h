/* mmulab_dsm.h — the Mirage DSM (fleisch89) for C programs.
 *
 * System V shared memory, coherent across the sites of a cluster: every
 * read returns the last value written, on whatever site (fleisch89 §5).
 * The functions below are those of libmmulab_shm.so. They behave as
 * Linux's shmget/shmat/shmdt/shmctl do (every shmctl command, the
 * kernel's errno for each case, each call checked against the calling
 * thread's credentials and the segment's owner, creator and mode; see
 * docs/dsm.md, "System V as Linux gives it") and talk to the site daemon
 * named by $MMULAB_DSM_SOCKET.
 *
 * Two ways to use it:
 *   - unmodified: `mmulab dsm run --config cluster.toml --site a -- ./prog`
 *     preloads libmmulab_shm.so, whose shmget/shmat/shmdt/shmctl replace
 *     the C library's;
 *   - explicitly: include this header, call mmulab_*, link with
 *     -L<dir> -lmmulab_shm, and run under `mmulab dsm run` (which sets
 *     $MMULAB_DSM_SOCKET).
 *
 * Lifetime (`semantics` in cluster.toml):
 *   - "sysv" (the default): as on Linux, a segment lives until IPC_RMID
 *     and its last detach, on every site; IPC_RMID frees the key at once.
 *   - "mirage" (fleisch89 §2.2): the last detach, on any site, destroys
 *     the segment, removed or not.
 * Mirage's rule, either way (fleisch89 §6):
 *   - Coherence before availability: if the only current copy of a page
 *     was on a site that died, touching the page raises SIGBUS at that
 *     address and prints one line naming the segment, page and site.
 *
 * Limits:
 *   - Statically linked programs never load libmmulab_shm.so and use the
 *     kernel's own segments (`mmulab dsm run` warns).
 *   - A system call that writes into a DSM page not held for writing on
 *     this site (read(fd, shm, n)) fails with EFAULT: touch the page first.
 *   - Installing your own SIGSEGV handler after shmat takes the page
 *     faults away from the DSM. A fork()ed child is re-armed before fork
 *     returns (pthread_atfork); a raw clone()/vfork() is not.
 */
#ifndef MMULAB_DSM_H
#define MMULAB_DSM_H

#include <stddef.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* As shmget(2); -1 and errno on error (ENOSYS: no site daemon). */
int mmulab_shmget(key_t key, size_t size, int shmflg);
/* As shmat(2); (void *)-1 and errno on error. */
void *mmulab_shmat(int shmid, const void *shmaddr, int shmflg);
/* As shmdt(2). */
int mmulab_shmdt(const void *shmaddr);
/* As shmctl(2): IPC_STAT, IPC_SET, IPC_RMID, IPC_INFO, SHM_INFO,
 * SHM_STAT, SHM_STAT_ANY, SHM_LOCK, SHM_UNLOCK. */
int mmulab_shmctl(int shmid, int cmd, struct shmid_ds *buf);
/* Sets Δ, the time a site keeps a page before it must give it up, in the
 * cluster's ticks (tick_ns in cluster.toml), for every page of a segment
 * created on this site (Δ lives at the library, fleisch89 §8). */
int mmulab_set_delta(int shmid, unsigned ticks);

#ifdef __cplusplus
}
#endif

#endif /* MMULAB_DSM_H */
