"""The sample's syscall filter: an allowlist, surveyed call by call (seccomp BPF).

Only the calls a Python program computing a function needs are allowed; everything else fails
with ENOSYS (what a C library reads as "this kernel does not have it" and works around), and the
calls below with EPERM. Calls that the kernel lets an unprivileged process make and that would
reach beyond the sample, grouped by what they would reach:

* **machine-wide resources a sample could exhaust**: asynchronous I/O (`io_setup` takes from the
  machine's `aio-max-nr`), `io_uring_*`, key rings (`add_key`, `request_key`, `keyctl`), SysV
  message queues, semaphores and shared memory, POSIX message queues (`mq_*`), `memfd_*`,
  `mlock*` (also refused by `RLIMIT_MEMLOCK` = 0), huge pages (`mmap` with `MAP_HUGETLB` takes
  from the machine's huge-page pool, which no memory cgroup here charges), `inotify_*` and
  `fanotify_*` watches, pipe buffer growth (`fcntl(F_SETPIPE_SZ)`), `sync`/`syncfs` (they make
  the whole machine write back);
* **machine-wide counters another sample could read later** (a channel that outlives its
  sender): every new pipe, socket, memfd, SysV or POSIX shared memory or message queue, shared
  anonymous mapping (`mmap(MAP_SHARED | MAP_ANONYMOUS)`) and proc inode takes an inode number from
  one machine-wide counter (`get_next_ino`) that any later process can read with `fstat` on its
  own pipes; `pidfd_*` (and `clone(CLONE_PIDFD)`) expose pidfs inode numbers, a machine-wide count
  of processes ever started; `sysinfo` reports the machine's process count and memory;
* **the page cache of the read-only files every sample sees**: `fadvise64` (evicts pages),
  `readahead`, `mincore`, `cachestat`, `preadv2`/`pwritev2` (`RWF_NOWAIT` tells whether a page is
  cached), `madvise` with `MADV_COLD`/`MADV_PAGEOUT`, and `MADV_MERGEABLE` (KSM merges equal pages
  across processes);
* **shared state through shared files**: `flock`, `fcntl` locks, leases and `F_NOTIFY`, and every
  futex operation without `FUTEX_PRIVATE_FLAG` other than a wait (a futex on a page of a shared
  file is keyed by the file);
* **privilege and the kernel's attack surface**: new namespaces (`unshare`, `setns`,
  `clone(CLONE_NEW*)`), `ptrace`, `process_vm_*`, `kcmp`, `bpf`, `perf_event_open`,
  `userfaultfd`, mounts, module and kexec loading, `open_by_handle_at`, uid and capability
  changes, NUMA policies, memory keys;
* **the network**: every socket call (the sample has no network namespace anyway).

`clone3` and the futex2 calls fail with ENOSYS, which the C library answers with `clone` and
`futex`. The numbers are those of the kernel's `unistd` tables (`tests/verify/test_sandbox.py`
checks them against the C headers where those are installed); calls newer than these tables get
ENOSYS.
"""
from __future__ import annotations

import errno

ALLOWED = (
    "read write readv writev pread64 pwrite64 preadv pwritev lseek close close_range dup dup2 "
    "dup3 ioctl fsync fdatasync ftruncate truncate fallocate sendfile splice tee copy_file_range "
    "open openat creat stat fstat lstat newfstatat statx statfs fstatfs access faccessat "
    "faccessat2 readlink readlinkat getdents getdents64 getcwd chdir fchdir rename renameat "
    "renameat2 mkdir mkdirat rmdir unlink unlinkat link linkat symlink symlinkat chmod fchmod "
    "fchmodat fchmodat2 chown fchown lchown fchownat umask utime utimes utimensat futimesat mknod "
    "mknodat setxattr lsetxattr fsetxattr getxattr lgetxattr fgetxattr listxattr llistxattr "
    "flistxattr removexattr lremovexattr fremovexattr brk munmap mprotect mremap msync mseal "
    "map_shadow_stack fork vfork execve execveat exit exit_group wait4 waitid kill tkill tgkill "
    "getpid getppid gettid getpgid getpgrp getsid setsid setpgid set_tid_address set_robust_list "
    "get_robust_list rseq arch_prctl prctl sched_yield sched_getaffinity sched_setaffinity "
    "sched_getparam sched_getscheduler sched_get_priority_max sched_get_priority_min "
    "sched_rr_get_interval getpriority setpriority nanosleep clock_nanosleep clock_gettime "
    "clock_getres gettimeofday time times getrusage getrlimit setrlimit prlimit64 getuid geteuid "
    "getgid getegid getresuid getresgid getgroups uname getrandom getcpu capget alarm getitimer "
    "setitimer pause timer_create timer_settime timer_gettime timer_getoverrun timer_delete "
    "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait rt_sigsuspend "
    "rt_sigqueueinfo rt_tgsigqueueinfo sigaltstack restart_syscall select pselect6 poll ppoll "
    "epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 eventfd eventfd2 "
    "timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4").split()
# Allowed with their arguments checked (see `program`).
CHECKED = ("clone", "fcntl", "futex", "mmap", "madvise")
NOT_IMPLEMENTED = ("clone3", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue")
DENIED = (
    "unshare setns socket socketpair pipe pipe2 keyctl add_key request_key ptrace bpf "
    "perf_event_open userfaultfd io_setup io_destroy io_submit io_cancel io_getevents "
    "io_pgetevents io_uring_setup io_uring_enter io_uring_register mount umount2 pivot_root "
    "chroot open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr open_by_handle_at "
    "name_to_handle_at kexec_load kexec_file_load init_module finit_module delete_module flock "
    "inotify_init inotify_init1 inotify_add_watch inotify_rm_watch fanotify_init fanotify_mark "
    "msgget msgsnd msgrcv msgctl semget semop semtimedop semctl shmget shmat shmdt shmctl mq_open "
    "mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr memfd_create memfd_secret "
    "pidfd_open pidfd_getfd pidfd_send_signal process_madvise process_mrelease sysinfo fadvise64 "
    "readahead mincore cachestat preadv2 pwritev2 sync syncfs sync_file_range mlock mlock2 "
    "munlock mlockall munlockall process_vm_readv process_vm_writev kcmp membarrier swapon "
    "swapoff reboot acct syslog setuid setgid setreuid setregid setresuid setresgid setfsuid "
    "setfsgid setgroups capset personality quotactl quotactl_fd mbind set_mempolicy "
    "get_mempolicy migrate_pages move_pages set_mempolicy_home_node statmount listmount vhangup "
    "modify_ldt iopl ioperm ioprio_set ioprio_get landlock_create_ruleset landlock_add_rule "
    "landlock_restrict_self seccomp remap_file_pages pkey_mprotect pkey_alloc pkey_free "
    "lsm_get_self_attr lsm_set_self_attr lsm_list_modules adjtimex clock_adjtime clock_settime "
    "settimeofday sethostname setdomainname accept accept4 bind connect listen sendto recvfrom "
    "sendmsg recvmsg sendmmsg recvmmsg shutdown getsockname getpeername setsockopt "
    "getsockopt").split()

# (audit arch, "name number ...") per machine, from the kernel's unistd tables.
_TABLES = {
    "x86_64": (
        "read 0 write 1 readv 19 writev 20 pread64 17 pwrite64 18 preadv 295 pwritev 296 lseek "
        "8 close 3 close_range 436 dup 32 dup2 33 dup3 292 ioctl 16 fsync 74 fdatasync 75 "
        "ftruncate 77 truncate 76 fallocate 285 sendfile 40 splice 275 tee 276 copy_file_range "
        "326 open 2 openat 257 creat 85 stat 4 fstat 5 lstat 6 newfstatat 262 statx 332 statfs "
        "137 fstatfs 138 access 21 faccessat 269 faccessat2 439 readlink 89 readlinkat 267 "
        "getdents 78 getdents64 217 getcwd 79 chdir 80 fchdir 81 rename 82 renameat 264 "
        "renameat2 316 mkdir 83 mkdirat 258 rmdir 84 unlink 87 unlinkat 263 link 86 linkat 265 "
        "symlink 88 symlinkat 266 chmod 90 fchmod 91 fchmodat 268 fchmodat2 452 chown 92 fchown "
        "93 lchown 94 fchownat 260 umask 95 utime 132 utimes 235 utimensat 280 futimesat 261 "
        "mknod 133 mknodat 259 setxattr 188 lsetxattr 189 fsetxattr 190 getxattr 191 lgetxattr "
        "192 fgetxattr 193 listxattr 194 llistxattr 195 flistxattr 196 removexattr 197 "
        "lremovexattr 198 fremovexattr 199 brk 12 munmap 11 mprotect 10 mremap 25 msync 26 "
        "mseal 462 map_shadow_stack 453 fork 57 vfork 58 execve 59 execveat 322 exit 60 "
        "exit_group 231 wait4 61 waitid 247 kill 62 tkill 200 tgkill 234 getpid 39 getppid 110 "
        "gettid 186 getpgid 121 getpgrp 111 getsid 124 setsid 112 setpgid 109 set_tid_address "
        "218 set_robust_list 273 get_robust_list 274 rseq 334 arch_prctl 158 prctl 157 "
        "sched_yield 24 sched_getaffinity 204 sched_setaffinity 203 sched_getparam 143 "
        "sched_getscheduler 145 sched_get_priority_max 146 sched_get_priority_min 147 "
        "sched_rr_get_interval 148 getpriority 140 setpriority 141 nanosleep 35 clock_nanosleep "
        "230 clock_gettime 228 clock_getres 229 gettimeofday 96 time 201 times 100 getrusage 98 "
        "getrlimit 97 setrlimit 160 prlimit64 302 getuid 102 geteuid 107 getgid 104 getegid 108 "
        "getresuid 118 getresgid 120 getgroups 115 uname 63 getrandom 318 getcpu 309 capget 125 "
        "alarm 37 getitimer 36 setitimer 38 pause 34 timer_create 222 timer_settime 223 "
        "timer_gettime 224 timer_getoverrun 225 timer_delete 226 rt_sigaction 13 rt_sigprocmask "
        "14 rt_sigreturn 15 rt_sigpending 127 rt_sigtimedwait 128 rt_sigsuspend 130 "
        "rt_sigqueueinfo 129 rt_tgsigqueueinfo 297 sigaltstack 131 restart_syscall 219 select "
        "23 pselect6 270 poll 7 ppoll 271 epoll_create 213 epoll_create1 291 epoll_ctl 233 "
        "epoll_wait 232 epoll_pwait 281 epoll_pwait2 441 eventfd 284 eventfd2 290 "
        "timerfd_create 283 timerfd_settime 286 timerfd_gettime 287 signalfd 282 signalfd4 289 "
        "clone 56 fcntl 72 futex 202 mmap 9 madvise 28 clone3 435 futex_waitv 449 futex_wake "
        "454 futex_wait 455 futex_requeue 456 unshare 272 setns 308 socket 41 socketpair 53 "
        "pipe 22 pipe2 293 keyctl 250 add_key 248 request_key 249 ptrace 101 bpf 321 "
        "perf_event_open 298 userfaultfd 323 io_setup 206 io_destroy 207 io_submit 209 "
        "io_cancel 210 io_getevents 208 io_pgetevents 333 io_uring_setup 425 io_uring_enter 426 "
        "io_uring_register 427 mount 165 umount2 166 pivot_root 155 chroot 161 open_tree 428 "
        "move_mount 429 fsopen 430 fsconfig 431 fsmount 432 fspick 433 mount_setattr 442 "
        "open_by_handle_at 304 name_to_handle_at 303 kexec_load 246 kexec_file_load 320 "
        "init_module 175 finit_module 313 delete_module 176 flock 73 inotify_init 253 "
        "inotify_init1 294 inotify_add_watch 254 inotify_rm_watch 255 fanotify_init 300 "
        "fanotify_mark 301 msgget 68 msgsnd 69 msgrcv 70 msgctl 71 semget 64 semop 65 "
        "semtimedop 220 semctl 66 shmget 29 shmat 30 shmdt 67 shmctl 31 mq_open 240 mq_unlink "
        "241 mq_timedsend 242 mq_timedreceive 243 mq_notify 244 mq_getsetattr 245 memfd_create "
        "319 memfd_secret 447 pidfd_open 434 pidfd_getfd 438 pidfd_send_signal 424 "
        "process_madvise 440 process_mrelease 448 sysinfo 99 fadvise64 221 readahead 187 "
        "mincore 27 cachestat 451 preadv2 327 pwritev2 328 sync 162 syncfs 306 sync_file_range "
        "277 mlock 149 mlock2 325 munlock 150 mlockall 151 munlockall 152 process_vm_readv 310 "
        "process_vm_writev 311 kcmp 312 membarrier 324 swapon 167 swapoff 168 reboot 169 acct "
        "163 syslog 103 setuid 105 setgid 106 setreuid 113 setregid 114 setresuid 117 setresgid "
        "119 setfsuid 122 setfsgid 123 setgroups 116 capset 126 personality 135 quotactl 179 "
        "quotactl_fd 443 mbind 237 set_mempolicy 238 get_mempolicy 239 migrate_pages 256 "
        "move_pages 279 set_mempolicy_home_node 450 statmount 457 listmount 458 vhangup 153 "
        "modify_ldt 154 iopl 172 ioperm 173 ioprio_set 251 ioprio_get 252 "
        "landlock_create_ruleset 444 landlock_add_rule 445 landlock_restrict_self 446 seccomp "
        "317 remap_file_pages 216 pkey_mprotect 329 pkey_alloc 330 pkey_free 331 "
        "lsm_get_self_attr 459 lsm_set_self_attr 460 lsm_list_modules 461 adjtimex 159 "
        "clock_adjtime 305 clock_settime 227 settimeofday 164 sethostname 170 setdomainname 171 "
        "accept 43 accept4 288 bind 49 connect 42 listen 50 sendto 44 recvfrom 45 sendmsg 46 "
        "recvmsg 47 sendmmsg 307 recvmmsg 299 shutdown 48 getsockname 51 getpeername 52 "
        "setsockopt 54 getsockopt 55 "
    ),
    "aarch64": (
        "map_shadow_stack 453 read 63 write 64 readv 65 writev 66 pread64 67 pwrite64 68 preadv "
        "69 pwritev 70 lseek 62 close 57 close_range 436 dup 23 dup3 24 ioctl 29 fsync 82 "
        "fdatasync 83 ftruncate 46 truncate 45 fallocate 47 sendfile 71 splice 76 tee 77 "
        "copy_file_range 285 openat 56 fstat 80 newfstatat 79 statx 291 statfs 43 fstatfs 44 "
        "faccessat 48 faccessat2 439 readlinkat 78 getdents64 61 getcwd 17 chdir 49 fchdir 50 "
        "renameat 38 renameat2 276 mkdirat 34 unlinkat 35 linkat 37 symlinkat 36 fchmod 52 "
        "fchmodat 53 fchmodat2 452 fchown 55 fchownat 54 umask 166 utimensat 88 mknodat 33 "
        "setxattr 5 lsetxattr 6 fsetxattr 7 getxattr 8 lgetxattr 9 fgetxattr 10 listxattr 11 "
        "llistxattr 12 flistxattr 13 removexattr 14 lremovexattr 15 fremovexattr 16 brk 214 "
        "munmap 215 mprotect 226 mremap 216 msync 227 mseal 462 execve 221 execveat 281 exit 93 "
        "exit_group 94 wait4 260 waitid 95 kill 129 tkill 130 tgkill 131 getpid 172 getppid 173 "
        "gettid 178 getpgid 155 getsid 156 setsid 157 setpgid 154 set_tid_address 96 "
        "set_robust_list 99 get_robust_list 100 rseq 293 prctl 167 sched_yield 124 "
        "sched_getaffinity 123 sched_setaffinity 122 sched_getparam 121 sched_getscheduler 120 "
        "sched_get_priority_max 125 sched_get_priority_min 126 sched_rr_get_interval 127 "
        "getpriority 141 setpriority 140 nanosleep 101 clock_nanosleep 115 clock_gettime 113 "
        "clock_getres 114 gettimeofday 169 times 153 getrusage 165 getrlimit 163 setrlimit 164 "
        "prlimit64 261 getuid 174 geteuid 175 getgid 176 getegid 177 getresuid 148 getresgid "
        "150 getgroups 158 uname 160 getrandom 278 getcpu 168 capget 90 getitimer 102 setitimer "
        "103 timer_create 107 timer_settime 110 timer_gettime 108 timer_getoverrun 109 "
        "timer_delete 111 rt_sigaction 134 rt_sigprocmask 135 rt_sigreturn 139 rt_sigpending "
        "136 rt_sigtimedwait 137 rt_sigsuspend 133 rt_sigqueueinfo 138 rt_tgsigqueueinfo 240 "
        "sigaltstack 132 restart_syscall 128 pselect6 72 ppoll 73 epoll_create1 20 epoll_ctl 21 "
        "epoll_pwait 22 epoll_pwait2 441 eventfd2 19 timerfd_create 85 timerfd_settime 86 "
        "timerfd_gettime 87 signalfd4 74 clone 220 fcntl 25 futex 98 mmap 222 madvise 233 "
        "clone3 435 futex_waitv 449 futex_wake 454 futex_wait 455 futex_requeue 456 unshare 97 "
        "setns 268 socket 198 socketpair 199 pipe2 59 keyctl 219 add_key 217 request_key 218 "
        "ptrace 117 bpf 280 perf_event_open 241 userfaultfd 282 io_setup 0 io_destroy 1 "
        "io_submit 2 io_cancel 3 io_getevents 4 io_pgetevents 292 io_uring_setup 425 "
        "io_uring_enter 426 io_uring_register 427 mount 40 umount2 39 pivot_root 41 chroot 51 "
        "open_tree 428 move_mount 429 fsopen 430 fsconfig 431 fsmount 432 fspick 433 "
        "mount_setattr 442 open_by_handle_at 265 name_to_handle_at 264 kexec_load 104 "
        "kexec_file_load 294 init_module 105 finit_module 273 delete_module 106 flock 32 "
        "inotify_init1 26 inotify_add_watch 27 inotify_rm_watch 28 fanotify_init 262 "
        "fanotify_mark 263 msgget 186 msgsnd 189 msgrcv 188 msgctl 187 semget 190 semop 193 "
        "semtimedop 192 semctl 191 shmget 194 shmat 196 shmdt 197 shmctl 195 mq_open 180 "
        "mq_unlink 181 mq_timedsend 182 mq_timedreceive 183 mq_notify 184 mq_getsetattr 185 "
        "memfd_create 279 memfd_secret 447 pidfd_open 434 pidfd_getfd 438 pidfd_send_signal 424 "
        "process_madvise 440 process_mrelease 448 sysinfo 179 fadvise64 223 readahead 213 "
        "mincore 232 cachestat 451 preadv2 286 pwritev2 287 sync 81 syncfs 267 sync_file_range "
        "84 mlock 228 mlock2 284 munlock 229 mlockall 230 munlockall 231 process_vm_readv 270 "
        "process_vm_writev 271 kcmp 272 membarrier 283 swapon 224 swapoff 225 reboot 142 acct "
        "89 syslog 116 setuid 146 setgid 144 setreuid 145 setregid 143 setresuid 147 setresgid "
        "149 setfsuid 151 setfsgid 152 setgroups 159 capset 91 personality 92 quotactl 60 "
        "quotactl_fd 443 mbind 235 set_mempolicy 237 get_mempolicy 236 migrate_pages 238 "
        "move_pages 239 set_mempolicy_home_node 450 statmount 457 listmount 458 vhangup 58 "
        "ioprio_set 30 ioprio_get 31 landlock_create_ruleset 444 landlock_add_rule 445 "
        "landlock_restrict_self 446 seccomp 277 remap_file_pages 234 pkey_mprotect 288 "
        "pkey_alloc 289 pkey_free 290 lsm_get_self_attr 459 lsm_set_self_attr 460 "
        "lsm_list_modules 461 adjtimex 171 clock_adjtime 266 clock_settime 112 settimeofday 170 "
        "sethostname 161 setdomainname 162 accept 202 accept4 242 bind 200 connect 203 listen "
        "201 sendto 206 recvfrom 207 sendmsg 211 recvmsg 212 sendmmsg 269 recvmmsg 243 shutdown "
        "210 getsockname 204 getpeername 205 setsockopt 208 getsockopt 209 "
    ),
}
_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# clone flags that make a new namespace or a pidfd (whose inode number counts every process the
# machine ever started).
_CLONE_DENIED = 0x7E021000
# fcntl commands that lock, query locks, lease, watch (dnotify) or grow a pipe: F_GETLK, F_SETLK,
# F_SETLKW (and their 64-bit forms), F_OFD_GETLK/SETLK/SETLKW, F_SETLEASE, F_GETLEASE, F_NOTIFY,
# F_SETPIPE_SZ.
_FCNTL_DENIED = (5, 6, 7, 12, 13, 14, 36, 37, 38, 1024, 1025, 1026, 1031)
_FUTEX_PRIVATE_FLAG, _FUTEX_CMD_MASK, _FUTEX_WAITS = 0x80, 0x7F, (0, 9)   # WAIT, WAIT_BITSET
_MAP_SHARED_ANONYMOUS, _MAP_HUGETLB = 0x21, 0x40000
# madvise advice that only concerns the caller's own memory (NORMAL ... DONTNEED, FREE,
# DONTFORK, DOFORK, UNMERGEABLE, (NO)HUGEPAGE, DONTDUMP, DODUMP, WIPEONFORK, KEEPONFORK).
_MADVISE_ALLOWED = (0, 1, 2, 3, 4, 8, 10, 11, 13, 14, 15, 16, 17, 18, 19)
_LD, _JEQ, _JGE, _JSET, _JA, _RET, _AND = 0x20, 0x15, 0x35, 0x45, 0x05, 0x06, 0x54
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_EPERM, _ENOSYS, _EINVAL = (0x00050000 | e for e in (errno.EPERM, errno.ENOSYS, errno.EINVAL))


def numbers(machine: str) -> dict[str, int]:
  """{syscall name: number} on `machine` (empty for a machine without a table)."""
  words = _TABLES.get(machine, "").split()
  return dict(zip(words[::2], (int(n) for n in words[1::2])))


def _arg(index: int) -> int:
  """Offset of the low 32 bits of argument `index` in struct seccomp_data (little-endian)."""
  return 16 + 8 * index


def _checked(nr: dict) -> list:
  """The argument checks, each a label followed by its code and its own returns."""
  code = [("clone",), (_LD, 0, 0, _arg(0)), (_JSET, "clone_no", 0, _CLONE_DENIED),
          (_RET, 0, 0, _ALLOW), ("clone_no",), (_RET, 0, 0, _EPERM)]
  code += [("fcntl",), (_LD, 0, 0, _arg(1))]
  code += [(_JEQ, "fcntl_no", 0, command) for command in _FCNTL_DENIED]
  code += [(_RET, 0, 0, _ALLOW), ("fcntl_no",), (_RET, 0, 0, _EPERM)]
  code += [("futex",), (_LD, 0, 0, _arg(1)), (_JSET, "futex_yes", 0, _FUTEX_PRIVATE_FLAG),
           (_AND, 0, 0, _FUTEX_CMD_MASK)]
  code += [(_JEQ, "futex_yes", 0, command) for command in _FUTEX_WAITS]
  code += [(_RET, 0, 0, _EINVAL), ("futex_yes",), (_RET, 0, 0, _ALLOW)]   # EINVAL: what glibc's
  code += [("mmap",), (_LD, 0, 0, _arg(3)), (_JSET, "mmap_no", 0, _MAP_HUGETLB),  # wake ignores
           (_AND, 0, 0, _MAP_SHARED_ANONYMOUS), (_JEQ, "mmap_no", 0, _MAP_SHARED_ANONYMOUS),
           (_RET, 0, 0, _ALLOW), ("mmap_no",), (_RET, 0, 0, _EPERM)]
  code += [("madvise",), (_LD, 0, 0, _arg(2))]
  code += [(_JEQ, "madvise_yes", 0, advice) for advice in _MADVISE_ALLOWED]
  code += [(_RET, 0, 0, _EPERM), ("madvise_yes",), (_RET, 0, 0, _ALLOW)]
  return code


def _matching(nr: dict, names, action: int, label: str) -> list:
  """Compares the syscall number with each of `names` (in blocks, so that every jump stays
  within BPF's 255-instruction reach); a match returns `action`."""
  present = [nr[name] for name in names if name in nr]
  code = []
  for start in range(0, len(present), 200):
    block = f"{label}{start}"
    code += [(_JEQ, block, 0, number) for number in present[start:start + 200]]
    code += [(_JA, 0, 0, f"{block}_past"), (block,), (_RET, 0, 0, action), (f"{block}_past",)]
  return code


def program(machine: str) -> list[tuple]:
  """The filter as (code, jt, jf, k) instructions; [] on a machine without a table."""
  nr = numbers(machine)
  if not nr:
    return []
  code = [(_LD, 0, 0, 4), (_JEQ, 1, 0, _ARCH[machine]), (_RET, 0, 0, _KILL), (_LD, 0, 0, 0)]
  if machine == "x86_64":
    code += [(_JGE, 0, 1, 0x40000000), (_RET, 0, 0, _ENOSYS)]   # the x32 ABI
  code += [(_JEQ, name, 0, nr[name]) for name in CHECKED]
  code += [(_JA, 0, 0, "lists")] + _checked(nr) + [("lists",)]
  code += _matching(nr, ALLOWED, _ALLOW, "allow")
  code += _matching(nr, DENIED, _EPERM, "deny")
  code += _matching(nr, NOT_IMPLEMENTED, _ENOSYS, "enosys")
  code.append((_RET, 0, 0, _ENOSYS))
  return _assemble(code)


def _assemble(code: list) -> list[tuple]:
  """Resolves labels (1-tuples mark a place) into relative jumps."""
  labels, instructions = {}, []
  for item in code:
    if len(item) == 1:
      labels[item[0]] = len(instructions)
    else:
      instructions.append(item)
  resolved = []
  for i, (op, jt, jf, k) in enumerate(instructions):
    if op == _JA:
      k = labels[k] - i - 1
    jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
    if not (0 <= jt <= 255 and 0 <= jf <= 255):
      raise ValueError(f"seccomp jump out of reach at instruction {i}")
    resolved.append((op, jt, jf, k))
  return resolved
