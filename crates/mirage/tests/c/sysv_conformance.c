/* System V shared memory as Linux gives it: one line per observation,
 * "case/step: result", where a result is "ok", an errno name or a value
 * that does not depend on where the segments live (booleans, sizes,
 * deltas). tests/sysv.rs runs it natively on the kernel and under
 * libmmulab_shm.so on a two-site cluster, as root and as nobody, and
 * compares the lines.
 *
 *   sysv_conformance root|user KEYBASE [case]
 *
 * "root" runs every case as root (cross-user steps in a forked child that
 * becomes nobody); "user" becomes nobody first, before any System V call.
 * Every wait is bounded (alarm). */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOBODY 65534
static int base;
static int as_root;
static long ps;

static const char *en(int e) {
    switch (e) {
    case EINVAL: return "EINVAL";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EEXIST: return "EEXIST";
    case EIDRM: return "EIDRM";
    case ENOSPC: return "ENOSPC";
    case ENOMEM: return "ENOMEM";
    case EFAULT: return "EFAULT";
    case ENOSYS: return "ENOSYS";
    case EIO: return "EIO";
    default: {
        static char b[32];
        snprintf(b, sizeof b, "errno%d", e);
        return b;
    }
    }
}

static int step(const char *c, const char *s, long r) {
    if (r == -1)
        printf("%s/%s: %s\n", c, s, en(errno));
    else
        printf("%s/%s: ok\n", c, s);
    fflush(stdout);
    return r != -1;
}

static void val(const char *c, const char *s, long v) {
    printf("%s/%s: %ld\n", c, s, v);
    fflush(stdout);
}

static long at(void *p) { return p == (void *)-1 ? -1 : 0; }

static void drop(void) {
    if (setgroups(0, NULL) != 0 || setgid(NOBODY) != 0 || setuid(NOBODY) != 0) {
        perror("drop to nobody");
        _exit(99);
    }
}

/* Runs f(arg) in a child that became nobody; waits for it. */
static void as_nobody(void (*f)(int), int arg) {
    fflush(stdout);
    pid_t p = fork();
    if (p == 0) {
        drop();
        f(arg);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
}

static long proc_num(const char *f) {
    FILE *fp = fopen(f, "r");
    long long v = -2;
    if (fp) {
        if (fscanf(fp, "%lld", &v) != 1) v = -2;
        fclose(fp);
    }
    return (long)v;
}

static unsigned long long proc_ull(const char *f) {
    FILE *fp = fopen(f, "r");
    unsigned long long v = 0;
    if (fp) {
        if (fscanf(fp, "%llu", &v) != 1) v = 0;
        fclose(fp);
    }
    return v;
}

static int proc_write(const char *f, long long v) {
    FILE *fp = fopen(f, "w");
    if (!fp) return -1;
    int ok = fprintf(fp, "%lld\n", v) > 0;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

static int proc_write_ull(const char *f, unsigned long long v) {
    FILE *fp = fopen(f, "w");
    if (!fp) return -1;
    int ok = fprintf(fp, "%llu\n", v) > 0;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

/* ---- permissions, checked by user ---------------------------------- */

static void perm_nobody(int id) {
    const char *c = "perm-nobody";
    struct shmid_ds ds;
    step(c, "shmget-key-no-mode", shmget(base + 1, 0, 0));
    step(c, "shmget-key-rw", shmget(base + 1, 4096, 0600));
    step(c, "shmget-key-r", shmget(base + 1, 4096, 0400));
    step(c, "shmat-rw", at(shmat(id, NULL, 0)));
    step(c, "shmat-ro", at(shmat(id, NULL, SHM_RDONLY)));
    step(c, "ipc-stat", shmctl(id, IPC_STAT, &ds));
    memset(&ds, 0, sizeof ds);
    ds.shm_perm.uid = NOBODY;
    ds.shm_perm.gid = NOBODY;
    ds.shm_perm.mode = 0666;
    step(c, "ipc-set", shmctl(id, IPC_SET, &ds));
    step(c, "ipc-rmid", shmctl(id, IPC_RMID, NULL));
    step(c, "shm-lock", shmctl(id, SHM_LOCK, NULL));
}

static void perm_nobody_readable(int id) {
    const char *c = "perm-nobody-0644";
    struct shmid_ds ds;
    void *p = shmat(id, NULL, SHM_RDONLY);
    if (step(c, "shmat-ro", at(p))) {
        val(c, "reads", *(volatile int *)p);
        /* A read-only attach cannot be made writable. */
        step(c, "mprotect-write", mprotect(p, ps, PROT_READ | PROT_WRITE));
        step(c, "shmdt", shmdt(p));
    }
    step(c, "shmat-rw", at(shmat(id, NULL, 0)));
    step(c, "ipc-stat", shmctl(id, IPC_STAT, &ds));
    step(c, "ipc-rmid", shmctl(id, IPC_RMID, NULL));
}

static void perm_group(int id) {
    const char *c = "perm-group";
    /* nobody is in group nogroup (65534) once its groups are set so. */
    gid_t g = NOBODY;
    (void)g;
    void *p = shmat(id, NULL, SHM_RDONLY);
    step(c, "shmat-ro-by-group", at(p));
    if (p != (void *)-1) shmdt(p);
    step(c, "shmat-rw-by-group", at(shmat(id, NULL, 0)));
}

static void perm_owner_nobody(int id) {
    const char *c = "perm-owner-nobody";
    struct shmid_ds ds;
    /* The owner (not creator) may stat, set and remove. */
    step(c, "ipc-stat", shmctl(id, IPC_STAT, &ds));
    step(c, "shmat-rw", at(shmat(id, NULL, 0)));
    if (shmctl(id, IPC_STAT, &ds) == 0) {
        ds.shm_perm.mode = 0;
        step(c, "ipc-set-mode-0", shmctl(id, IPC_SET, &ds));
        step(c, "ipc-stat-mode-0", shmctl(id, IPC_STAT, &ds));
    }
    step(c, "ipc-rmid", shmctl(id, IPC_RMID, NULL));
}

static void case_perm(void) {
    const char *c = "perm";
    struct shmid_ds ds;
    int id = shmget(base + 1, 4096, IPC_CREAT | IPC_EXCL | 0600);
    if (!step(c, "create-0600", id)) return;
    if (as_root) {
        as_nobody(perm_nobody, id);
        step(c, "still-there", shmctl(id, IPC_STAT, &ds));
        ds.shm_perm.mode = 0644;
        step(c, "set-0644", shmctl(id, IPC_SET, &ds));
        int *p = shmat(id, NULL, 0);
        if (step(c, "shmat", at(p))) {
            p[0] = 77;
            shmdt(p);
        }
        as_nobody(perm_nobody_readable, id);
        /* Group access: group nogroup, mode 0640. */
        shmctl(id, IPC_STAT, &ds);
        ds.shm_perm.gid = NOBODY;
        ds.shm_perm.mode = 0640;
        step(c, "set-group", shmctl(id, IPC_SET, &ds));
        as_nobody(perm_group, id);
        /* Root keeps CAP_IPC_OWNER on a mode-0 segment. */
        ds.shm_perm.mode = 0;
        step(c, "set-mode-0", shmctl(id, IPC_SET, &ds));
        step(c, "root-stat-mode-0", shmctl(id, IPC_STAT, &ds));
        step(c, "root-shmat-mode-0", at(shmat(id, NULL, SHM_RDONLY)));
        /* An invalid owner is EINVAL. */
        ds.shm_perm.uid = (uid_t)-1;
        step(c, "set-uid-minus-1", shmctl(id, IPC_SET, &ds));
        /* Hand it to nobody: the owner may remove it. */
        shmctl(id, IPC_STAT, &ds);
        ds.shm_perm.uid = NOBODY;
        ds.shm_perm.mode = 0600;
        step(c, "give-to-nobody", shmctl(id, IPC_SET, &ds));
        as_nobody(perm_owner_nobody, id);
        step(c, "gone-after-owner-rmid", shmctl(id, IPC_STAT, &ds));
        /* A mode the caller lacks, asked at shmget. */
        int k = shmget(base + 2, 4096, IPC_CREAT | IPC_EXCL | 0400);
        step(c, "create-0400", k);
        as_nobody(perm_nobody, k);
        shmctl(k, IPC_RMID, NULL);
        shmctl(id, IPC_RMID, NULL);
    } else {
        /* The caller owns it: owner bits only. */
        ds.shm_perm.mode = 0;
        shmctl(id, IPC_STAT, &ds);
        ds.shm_perm.mode = 0200;
        step(c, "set-0200", shmctl(id, IPC_SET, &ds));
        step(c, "own-stat-write-only", shmctl(id, IPC_STAT, &ds));
        step(c, "own-shmget-r", shmget(base + 1, 0, 0400));
        step(c, "own-shmat-ro", at(shmat(id, NULL, SHM_RDONLY)));
        step(c, "own-shmat-exec", at(shmat(id, NULL, SHM_EXEC)));
        step(c, "own-rmid", shmctl(id, IPC_RMID, NULL));
        step(c, "own-stat-after-rmid", shmctl(id, IPC_STAT, &ds));
    }
}

/* ---- credentials at the time of each call ------------------------- */

static void creds_child(int id) {
    /* Forked while the parent had the segment attached: this child's
     * connection to a site daemon was opened by its parent, as root. */
    const char *c = "creds-child";
    step(c, "shmat-as-nobody", at(shmat(id, NULL, 0)));
    struct shmid_ds ds;
    step(c, "stat-as-nobody", shmctl(id, IPC_STAT, &ds));
}

static void case_creds(void) {
    const char *c = "creds";
    if (!as_root) return;
    struct shmid_ds ds;
    int id = shmget(base + 17, 4096, IPC_CREAT | IPC_EXCL | 0600);
    void *p = shmat(id, NULL, 0);
    step(c, "attach-as-root", at(p));
    as_nobody(creds_child, id);
    /* The same process and connection, another effective user. */
    step(c, "seteuid-nobody", seteuid(NOBODY));
    step(c, "shmat-as-euid-nobody", at(shmat(id, NULL, 0)));
    step(c, "stat-as-euid-nobody", shmctl(id, IPC_STAT, &ds));
    step(c, "rmid-as-euid-nobody", shmctl(id, IPC_RMID, NULL));
    step(c, "seteuid-root", seteuid(0));
    step(c, "stat-as-root-again", shmctl(id, IPC_STAT, &ds));
    shmdt(p);
    shmctl(id, IPC_RMID, NULL);
}

/* ---- ids and keys: Linux's life cycle ------------------------------ */

static void case_ids(void) {
    const char *c = "ids";
    struct shmid_ds ds;
    int id = shmget(base + 3, 4096, IPC_CREAT | IPC_EXCL | 0600);
    step(c, "create", id);
    step(c, "create-excl-again", shmget(base + 3, 4096, IPC_CREAT | IPC_EXCL | 0600));
    step(c, "get-no-creat", shmget(base + 4, 4096, 0600));
    step(c, "rmid", shmctl(id, IPC_RMID, NULL));
    step(c, "stat-removed", shmctl(id, IPC_STAT, &ds));
    step(c, "shmat-removed", at(shmat(id, NULL, 0)));
    step(c, "rmid-removed", shmctl(id, IPC_RMID, NULL));
    step(c, "key-gone", shmget(base + 3, 4096, 0600));
    int again = shmget(base + 3, 4096, IPC_CREAT | 0600);
    step(c, "key-free-again", again);
    val(c, "new-id-differs", again != id);
    /* Removed while attached: SHM_DEST, key 0, still attachable. */
    int *p = shmat(again, NULL, 0);
    step(c, "attach", at(p));
    p[0] = 5;
    step(c, "rmid-attached", shmctl(again, IPC_RMID, NULL));
    if (step(c, "stat-dest", shmctl(again, IPC_STAT, &ds))) {
        val(c, "dest-bit", (ds.shm_perm.mode & SHM_DEST) != 0);
        val(c, "dest-key", ds.shm_perm.__key);
        val(c, "dest-nattch", ds.shm_nattch);
    }
    step(c, "key-gone-while-attached", shmget(base + 3, 4096, 0600));
    int *q = shmat(again, NULL, 0);
    if (step(c, "attach-dest", at(q))) {
        val(c, "shared", q[0]);
        shmdt(q);
    }
    step(c, "detach-last", shmdt(p));
    step(c, "stat-after-last-detach", shmctl(again, IPC_STAT, &ds));
    step(c, "shmdt-twice", shmdt(p));
    /* The last detach of a segment not removed keeps it (System V). */
    int live = shmget(base + 5, 8192, IPC_CREAT | IPC_EXCL | 0600);
    int *l = shmat(live, NULL, 0);
    l[1000] = 1234;
    step(c, "detach-live", shmdt(l));
    if (step(c, "stat-live-unattached", shmctl(live, IPC_STAT, &ds)))
        val(c, "live-nattch", ds.shm_nattch);
    step(c, "get-live-by-key", shmget(base + 5, 0, 0600));
    l = shmat(live, NULL, 0);
    if (step(c, "reattach-live", at(l))) {
        val(c, "kept", l[1000]);
        shmdt(l);
    }
    shmctl(live, IPC_RMID, NULL);
    step(c, "shmat-negative", at(shmat(-1, NULL, 0)));
    step(c, "shmctl-negative", shmctl(-1, IPC_STAT, &ds));
    step(c, "shmctl-bad-cmd", shmctl(live, 99, &ds));
    step(c, "shmctl-ipc64-flag", shmctl(live, IPC_STAT | 0x100, &ds));
    int pr1 = shmget(IPC_PRIVATE, 100, 0600), pr2 = shmget(IPC_PRIVATE, 100, 0600);
    val(c, "private-distinct", pr1 >= 0 && pr2 >= 0 && pr1 != pr2);
    shmctl(pr1, IPC_RMID, NULL);
    shmctl(pr2, IPC_RMID, NULL);
}

/* ---- sizes and limits ----------------------------------------------- */

static void case_size(void) {
    const char *c = "size";
    int id = shmget(base + 6, 3 * ps, IPC_CREAT | IPC_EXCL | 0600);
    step(c, "create-3-pages", id);
    step(c, "get-larger", shmget(base + 6, 4 * ps, 0600));
    step(c, "get-smaller", shmget(base + 6, ps, 0600));
    step(c, "get-zero", shmget(base + 6, 0, 0600));
    step(c, "get-larger-creat", shmget(base + 6, 4 * ps, IPC_CREAT | 0600));
    step(c, "create-zero", shmget(base + 7, 0, IPC_CREAT | 0600));
    step(c, "private-zero", shmget(IPC_PRIVATE, 0, 0600));
    struct shmid_ds ds;
    if (step(c, "stat", shmctl(id, IPC_STAT, &ds))) val(c, "segsz", ds.shm_segsz);
    int odd = shmget(IPC_PRIVATE, 5000, 0600);
    if (step(c, "odd-size", odd) && shmctl(odd, IPC_STAT, &ds) == 0) val(c, "odd-segsz", ds.shm_segsz);
    shmctl(odd, IPC_RMID, NULL);
    shmctl(id, IPC_RMID, NULL);
}

static void case_limits(void) {
    const char *c = "limits";
    if (!as_root) return;
    unsigned long long mx = proc_ull("/proc/sys/kernel/shmmax");
    long mni = proc_num("/proc/sys/kernel/shmmni");
    unsigned long long all = proc_ull("/proc/sys/kernel/shmall");
    struct shm_info si;
    /* shmmax */
    step(c, "set-shmmax", proc_write("/proc/sys/kernel/shmmax", 8192));
    step(c, "over-shmmax", shmget(IPC_PRIVATE, 8193, 0600));
    int m = shmget(IPC_PRIVATE, 8192, 0600);
    step(c, "at-shmmax", m);
    shmctl(m, IPC_RMID, NULL);
    proc_write_ull("/proc/sys/kernel/shmmax", mx);
    /* shmmni: room for two more than are in use now. */
    shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    step(c, "set-shmmni", proc_write("/proc/sys/kernel/shmmni", si.used_ids + 2));
    int a = shmget(IPC_PRIVATE, 64, 0600), b = shmget(IPC_PRIVATE, 64, 0600);
    val(c, "two-fit", a >= 0 && b >= 0);
    step(c, "third-enospc", shmget(IPC_PRIVATE, 64, 0600));
    step(c, "third-key-enospc", shmget(base + 8, 64, IPC_CREAT | 0600));
    shmctl(a, IPC_RMID, NULL);
    shmctl(b, IPC_RMID, NULL);
    proc_write("/proc/sys/kernel/shmmni", mni);
    /* shmall: two more pages than are in use now. */
    shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    step(c, "set-shmall", proc_write("/proc/sys/kernel/shmall", si.shm_tot + 2));
    step(c, "three-pages-enospc", shmget(IPC_PRIVATE, 3 * ps, 0600));
    int t = shmget(IPC_PRIVATE, 2 * ps, 0600);
    step(c, "two-pages", t);
    shmctl(t, IPC_RMID, NULL);
    proc_write_ull("/proc/sys/kernel/shmall", all);
    /* shm_next_id */
    int want = (7 << 15) | 4321;
    step(c, "set-next-id", proc_write("/proc/sys/kernel/shm_next_id", want));
    int n = shmget(IPC_PRIVATE, 64, 0600);
    val(c, "next-id-honoured", n == want);
    val(c, "next-id-reset", proc_num("/proc/sys/kernel/shm_next_id"));
    int n2 = shmget(IPC_PRIVATE, 64, 0600);
    val(c, "after-next-id-differs", n2 != want && n2 >= 0);
    shmctl(n, IPC_RMID, NULL);
    shmctl(n2, IPC_RMID, NULL);
}

/* ---- shmid_ds: times, pids, bits ------------------------------------ */

static int near(time_t t) { time_t now = time(NULL); return t <= now && now - t <= 3; }

static void case_ds(void) {
    const char *c = "ds";
    struct shmid_ds ds;
    int id = shmget(base + 9, 2 * ps, IPC_CREAT | IPC_EXCL | 0640);
    step(c, "create", id);
    shmctl(id, IPC_STAT, &ds);
    val(c, "ctime-now", near(ds.shm_ctime));
    val(c, "atime-zero", ds.shm_atime == 0);
    val(c, "dtime-zero", ds.shm_dtime == 0);
    val(c, "cpid-me", ds.shm_cpid == getpid());
    val(c, "lpid-zero", ds.shm_lpid == 0);
    val(c, "uid-me", ds.shm_perm.uid == geteuid() && ds.shm_perm.cuid == geteuid());
    val(c, "gid-me", ds.shm_perm.gid == getegid() && ds.shm_perm.cgid == getegid());
    val(c, "mode", ds.shm_perm.mode);
    val(c, "key", ds.shm_perm.__key == base + 9);
    val(c, "nattch", ds.shm_nattch);
    time_t c0 = ds.shm_ctime;
    void *p = shmat(id, NULL, 0);
    shmctl(id, IPC_STAT, &ds);
    val(c, "atime-after-attach", near(ds.shm_atime));
    val(c, "lpid-after-attach", ds.shm_lpid == getpid());
    val(c, "nattch-1", ds.shm_nattch);
    /* A forked child inherits the attach; its exit detaches it. */
    fflush(stdout);
    pid_t ch = fork();
    if (ch == 0) {
        struct shmid_ds d2;
        shmctl(id, IPC_STAT, &d2);
        printf("%s/child-nattch: %ld\n", c, (long)d2.shm_nattch);
        void *q = shmat(id, NULL, SHM_RDONLY);
        shmctl(id, IPC_STAT, &d2);
        printf("%s/child-lpid-child: %d\n", c, d2.shm_lpid == getpid());
        shmdt(q);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(ch, &st, 0);
    shmctl(id, IPC_STAT, &ds);
    val(c, "nattch-after-child", ds.shm_nattch);
    val(c, "lpid-child", ds.shm_lpid == ch);
    shmdt(p);
    shmctl(id, IPC_STAT, &ds);
    val(c, "dtime-after-detach", near(ds.shm_dtime));
    val(c, "lpid-after-detach", ds.shm_lpid == getpid());
    sleep(1);
    ds.shm_perm.mode = 0600;
    shmctl(id, IPC_SET, &ds);
    shmctl(id, IPC_STAT, &ds);
    val(c, "ctime-updated", ds.shm_ctime > c0);
    val(c, "mode-set", ds.shm_perm.mode);
    step(c, "stat-efault", shmctl(id, IPC_STAT, (struct shmid_ds *)-1));
    step(c, "set-efault", shmctl(id, IPC_SET, (struct shmid_ds *)-1));
    step(c, "stat-null", shmctl(id, IPC_STAT, NULL));
    step(c, "stat-bad-id-null", shmctl(id + 1000000, IPC_STAT, NULL));
    shmctl(id, IPC_RMID, NULL);
}

/* ---- IPC_INFO, SHM_INFO, SHM_STAT, SHM_STAT_ANY ------------------- */

static void stat_nobody(int id) {
    const char *c = "info-nobody";
    struct shminfo info;
    int max = shmctl(0, IPC_INFO, (struct shmid_ds *)&info);
    int found = 0, any = 0;
    struct shmid_ds ds;
    for (int i = 0; i <= max; i++) {
        errno = 0;
        int r = shmctl(i, SHM_STAT, &ds);
        if (r == id) found = 1;
        if (r == -1 && errno == EACCES && ds.shm_perm.__key == 0) {}
        if (shmctl(i, SHM_STAT_ANY, &ds) == id) any = 1;
    }
    val(c, "shm-stat-finds-0600-of-root", found);
    val(c, "shm-stat-any-finds-it", any);
}

static void case_info(void) {
    const char *c = "info";
    struct shminfo info;
    struct shm_info si0, si;
    int max = shmctl(0, IPC_INFO, (struct shmid_ds *)&info);
    step(c, "ipc-info", max);
    val(c, "shmmax", info.shmmax == proc_ull("/proc/sys/kernel/shmmax"));
    val(c, "shmall", info.shmall == proc_ull("/proc/sys/kernel/shmall"));
    val(c, "shmmni", (long)info.shmmni == proc_num("/proc/sys/kernel/shmmni"));
    val(c, "shmseg", info.shmseg == info.shmmni);
    val(c, "shmmin", info.shmmin);
    step(c, "ipc-info-efault", shmctl(0, IPC_INFO, (struct shmid_ds *)-1));
    shmctl(0, SHM_INFO, (struct shmid_ds *)&si0);
    int id = shmget(base + 10, 3 * ps, IPC_CREAT | IPC_EXCL | 0600);
    int r = shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    step(c, "shm-info", r);
    val(c, "used-ids-delta", si.used_ids - si0.used_ids);
    val(c, "shm-tot-delta", si.shm_tot - si0.shm_tot);
    char *p = shmat(id, NULL, 0);
    p[0] = 1;
    p[ps] = 1;
    shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    val(c, "shm-rss-delta-2", si.shm_rss - si0.shm_rss >= 2);
    val(c, "shm-rss-le-tot", si.shm_rss <= si.shm_tot);
    shmdt(p);
    max = shmctl(0, IPC_INFO, (struct shmid_ds *)&info);
    val(c, "max-covers-ours", (id & 0x7fff) <= max);
    struct shmid_ds ds;
    int found = shmctl(id & 0x7fff, SHM_STAT, &ds);
    val(c, "shm-stat-returns-id", found == id);
    val(c, "shm-stat-segsz", ds.shm_segsz);
    val(c, "shm-stat-any-returns-id", shmctl(id & 0x7fff, SHM_STAT_ANY, &ds) == id);
    step(c, "shm-stat-past-max", shmctl(max + 1, SHM_STAT, &ds));
    step(c, "shm-stat-efault", shmctl(id & 0x7fff, SHM_STAT, (struct shmid_ds *)-1));
    if (as_root) as_nobody(stat_nobody, id);
    shmctl(id, IPC_RMID, NULL);
    shmctl(0, SHM_INFO, (struct shmid_ds *)&si);
    val(c, "used-ids-back", si.used_ids - si0.used_ids);
}

/* ---- SHM_LOCK, SHM_UNLOCK -------------------------------------------- */

static void lock_nobody(int id) {
    const char *c = "lock-nobody";
    step(c, "lock-not-owner", shmctl(id, SHM_LOCK, NULL));
    step(c, "unlock-not-owner", shmctl(id, SHM_UNLOCK, NULL));
}

static void case_lock(void) {
    const char *c = "lock";
    struct shmid_ds ds;
    int id = shmget(base + 11, 4 * ps, IPC_CREAT | IPC_EXCL | 0600);
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    if (!as_root) {
        struct rlimit none = {0, rl.rlim_max};
        setrlimit(RLIMIT_MEMLOCK, &none);
        step(c, "lock-no-rlimit", shmctl(id, SHM_LOCK, NULL));
        struct rlimit small = {2 * ps, rl.rlim_max};
        if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)(2 * ps)) {
            setrlimit(RLIMIT_MEMLOCK, &small);
            step(c, "lock-over-rlimit", shmctl(id, SHM_LOCK, NULL));
        }
        setrlimit(RLIMIT_MEMLOCK, &rl);
    }
    step(c, "lock", shmctl(id, SHM_LOCK, NULL));
    shmctl(id, IPC_STAT, &ds);
    val(c, "locked-bit", (ds.shm_perm.mode & SHM_LOCKED) != 0);
    step(c, "lock-again", shmctl(id, SHM_LOCK, NULL));
    char *p = shmat(id, NULL, 0);
    if (step(c, "attach-locked", at(p))) {
        memset(p, 7, 4 * ps);
        val(c, "locked-data", p[3 * ps]);
        shmdt(p);
    }
    if (as_root) as_nobody(lock_nobody, id);
    step(c, "unlock", shmctl(id, SHM_UNLOCK, NULL));
    shmctl(id, IPC_STAT, &ds);
    val(c, "unlocked-bit", (ds.shm_perm.mode & SHM_LOCKED) != 0);
    step(c, "unlock-again", shmctl(id, SHM_UNLOCK, NULL));
    step(c, "lock-bad-id", shmctl(id + 1000000, SHM_LOCK, NULL));
    shmctl(id, IPC_RMID, NULL);
}

/* ---- SHM_HUGETLB ------------------------------------------------------ */

static void case_huge(void) {
    const char *c = "huge";
    long hp = 2 << 20;
    step(c, "hugetlb", shmget(IPC_PRIVATE, hp, SHM_HUGETLB | 0600));
    step(c, "hugetlb-key", shmget(base + 12, hp, IPC_CREAT | SHM_HUGETLB | 0600));
    step(c, "hugetlb-bad-size-log", shmget(IPC_PRIVATE, hp, SHM_HUGETLB | (40 << 26) | 0600));
}

/* ---- raw system calls -------------------------------------------------- */

static void case_raw(void) {
    const char *c = "raw";
    struct shmid_ds ds;
    int id = (int)syscall(SYS_shmget, base + 13, 4096, IPC_CREAT | IPC_EXCL | 0600);
    step(c, "raw-shmget", id);
    step(c, "libc-stat-of-raw", shmctl(id, IPC_STAT, &ds));
    int *p = (int *)syscall(SYS_shmat, id, NULL, 0);
    step(c, "raw-shmat", at(p));
    int *q = shmat(id, NULL, 0);
    if (p != (void *)-1 && q != (void *)-1) {
        p[3] = 99;
        val(c, "shared-raw-libc", q[3]);
        shmdt(q);
    }
    step(c, "raw-stat", syscall(SYS_shmctl, id, IPC_STAT, &ds));
    val(c, "raw-nattch", ds.shm_nattch);
    step(c, "raw-shmdt", syscall(SYS_shmdt, p));
    step(c, "raw-shmdt-again", syscall(SYS_shmdt, p));
    step(c, "raw-bad-cmd", syscall(SYS_shmctl, id, 99, &ds));
    step(c, "raw-rmid", syscall(SYS_shmctl, id, IPC_RMID, NULL));
    step(c, "libc-stat-after-raw-rmid", shmctl(id, IPC_STAT, &ds));
    int k = shmget(IPC_PRIVATE, 4096, 0600);
    step(c, "raw-stat-of-libc", syscall(SYS_shmctl, k, IPC_STAT, &ds));
    shmctl(k, IPC_RMID, NULL);
    errno = 0;
    long r = syscall(SYS_shmctl, 0x7ffffff0, IPC_STAT, &ds);
    step(c, "raw-stat-unknown-id", r);
}

/* ---- remap_file_pages --------------------------------------------- */

static void case_remap(void) {
    const char *c = "remap";
    int id = shmget(base + 14, 2 * ps, IPC_CREAT | IPC_EXCL | 0600);
    char *p = shmat(id, NULL, 0);
    p[0] = 9;
    step(c, "remap-live", remap_file_pages(p, 2 * ps, 0, 0, 0));
    val(c, "data-after-remap", p[0]);
    step(c, "remap-live-part", remap_file_pages(p, ps, 0, 0, 0));
    step(c, "remap-prot", remap_file_pages(p, ps, PROT_READ, 0, 0));
    step(c, "remap-past-end", remap_file_pages(p, 3 * ps, 0, 0, 0));
    step(c, "rmid", shmctl(id, IPC_RMID, NULL));
    /* The last attach of a removed segment: the kernel's unmap destroys
     * it, and the map fails. */
    step(c, "remap-removed-last", remap_file_pages(p, 2 * ps, 0, 0, 0));
    step(c, "remap-removed-again", remap_file_pages(p, 2 * ps, 0, 0, 0));
    step(c, "shmdt-after", shmdt(p));
    struct shmid_ds ds;
    step(c, "stat-after", shmctl(id, IPC_STAT, &ds));
    /* Not removed, two attaches: a remap of one keeps it. */
    int k = shmget(base + 15, ps, IPC_CREAT | IPC_EXCL | 0600);
    char *a = shmat(k, NULL, 0), *b = shmat(k, NULL, 0);
    shmctl(k, IPC_RMID, NULL);
    step(c, "remap-removed-not-last", remap_file_pages(a, ps, 0, 0, 0));
    a[1] = 3;
    val(c, "shared-after", b[1]);
    shmdt(a);
    shmdt(b);
    step(c, "remap-anon", remap_file_pages(&ds, ps, 0, 0, 0));
    step(c, "raw-remap-removed", syscall(SYS_remap_file_pages, p, ps, 0, 0, 0));
}

/* ---- shmat's address and flags ------------------------------------ */

static void case_attach(void) {
    const char *c = "attach";
    int id = shmget(base + 16, 2 * ps, IPC_CREAT | IPC_EXCL | 0600);
    char *p = shmat(id, NULL, 0);
    step(c, "anywhere", at(p));
    step(c, "remap-without-addr", at(shmat(id, NULL, SHM_REMAP)));
    step(c, "unaligned", at(shmat(id, p + 1, 0)));
    step(c, "occupied", at(shmat(id, p, 0)));
    shmdt(p);
    char *r = shmat(id, p + 5, SHM_RND);
    val(c, "rnd-rounds-down", r == p);
    char *m = mmap(NULL, 2 * ps, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *over = shmat(id, m, SHM_REMAP);
    val(c, "shm-remap-replaces", over == m);
    over[1] = 8;
    val(c, "via-remap", r[1]);
    step(c, "shmdt-remap", shmdt(over));
    step(c, "shmdt-unaligned", shmdt(r + 1));
    step(c, "shmdt-not-attached", shmdt(&c));
    step(c, "shmdt-rnd", shmdt(r));
    void *x = shmat(id, NULL, SHM_EXEC);
    step(c, "exec-own-0600", at(x));
    if (x != (void *)-1) shmdt(x);
    /* A write through SHM_RDONLY is SIGSEGV. */
    fflush(stdout);
    pid_t ch = fork();
    if (ch == 0) {
        alarm(20);
        volatile char *ro = shmat(id, NULL, SHM_RDONLY);
        ro[0] = 1;
        _exit(0);
    }
    int st;
    waitpid(ch, &st, 0);
    val(c, "rdonly-write-signal", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    shmctl(id, IPC_RMID, NULL);
}

struct kase {
    const char *name;
    void (*f)(void);
};

static const struct kase cases[] = {
    {"perm", case_perm},     {"creds", case_creds},   {"ids", case_ids},
    {"size", case_size},
    {"limits", case_limits}, {"ds", case_ds},         {"info", case_info},
    {"lock", case_lock},     {"huge", case_huge},     {"raw", case_raw},
    {"remap", case_remap},   {"attach", case_attach},
};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s root|user KEYBASE [case]\n", argv[0]);
        return 2;
    }
    ps = sysconf(_SC_PAGESIZE);
    as_root = strcmp(argv[1], "root") == 0;
    base = atoi(argv[2]);
    alarm(120);
    if (!as_root) drop();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 3 && strcmp(argv[3], cases[i].name) != 0) continue;
        cases[i].f();
    }
    printf("done\n");
    return 0;
}
