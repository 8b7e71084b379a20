"""Calling a C function in another process's thread with ``ptrace`` (Linux, x86-64), as a debugger
does: seize the thread, interrupt it, save its registers, point it at the function with a return
address of 0, let it run until the return faults at 0, read the result, put every register back and
let go. The thread then goes on where it was; a system call it was blocked in is restarted (the
saved ``orig_rax`` is restored, and set to -1 during our call so the kernel does not restart it into
our function, as gdb does).

Only functions that are safe to call from an interrupted thread may be called: ones that take no
lock the interrupted code might hold (``mmap``; ``Py_AddPendingCall``, whose lock only the pending
calls' own code takes). A call that does not return within its timeout is abandoned: the registers
are put back as they were.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import time
from functools import cache
from typing import Any

from cuptistream.cupti.libc import libc

_PTRACE_CONT = 7
_PTRACE_DETACH = 17
_PTRACE_GETREGS = 12
_PTRACE_SETREGS = 13
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_WALL = 0x40000000
_FAULTS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
# struct user_regs_struct (sys/user.h), in order
_REGISTERS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx",
              "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds",
              "es", "fs", "gs")  # fmt: skip
_ARGUMENTS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")  # System V AMD64 calling convention
_STACK_SKIP = 1024  # below the thread's stack pointer: past the 128-byte red zone, with room


class Registers(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in _REGISTERS]


class PtraceError(OSError):
    """A ptrace request failed; ``errno`` says why (EPERM: not allowed, ESRCH: gone)."""


def supported() -> bool:
    return platform.machine() in ("x86_64", "AMD64") and os.name == "posix"


@cache
def _ptrace_function() -> Any:
    function = libc().ptrace
    function.restype = ctypes.c_long
    function.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return function


def _ptrace(request: int, tid: int, address: int = 0, data: int | ctypes.c_void_p = 0) -> int:
    result: int = _ptrace_function()(request, tid, ctypes.c_void_p(address), data)
    if result == -1:
        code = ctypes.get_errno()
        if code:
            raise PtraceError(code, os.strerror(code))
    return result


class Tracee:
    """One thread of another process, seized for a few calls: ``with Tracee(tid) as t: t.call(...)``.
    Other threads of the process run on meanwhile."""

    def __init__(self, pid: int, tid: int | None = None) -> None:
        self.pid = pid
        self.tid = pid if tid is None else tid
        self._seized = False
        self._saved: Registers | None = None
        self._memory: int | None = None

    def __enter__(self) -> Tracee:
        _ptrace(_PTRACE_SEIZE, self.tid)
        self._seized = True
        try:
            _ptrace(_PTRACE_INTERRUPT, self.tid)
            self._wait_stop(5.0)
            self._saved = self._registers()
        except BaseException:
            self._let_go()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._let_go()

    def _let_go(self) -> None:
        if self._memory is not None:
            os.close(self._memory)
            self._memory = None
        if not self._seized:
            return
        self._seized = False
        try:
            if self._saved is not None:
                _ptrace(_PTRACE_SETREGS, self.tid, 0, ctypes.addressof(self._saved))
            _ptrace(_PTRACE_DETACH, self.tid, 0, 0)
        except PtraceError as error:
            if error.errno != errno.ESRCH:  # gone: nothing to put back
                raise

    def _registers(self) -> Registers:
        registers = Registers()
        _ptrace(_PTRACE_GETREGS, self.tid, 0, ctypes.addressof(registers))
        return registers

    def _wait_stop(self, timeout: float) -> int:
        """Wait until the thread stops; its stop signal. Raises ``TimeoutError``."""
        ends = time.monotonic() + timeout
        while True:
            tid, status = os.waitpid(self.tid, os.WNOHANG | _WALL)
            if tid == self.tid:
                if os.WIFSTOPPED(status):
                    return os.WSTOPSIG(status)
                raise PtraceError(errno.ESRCH, f"thread {self.tid} ended")
            if time.monotonic() > ends:
                raise TimeoutError(f"thread {self.tid} did not stop within {timeout:g} s")
            time.sleep(0.0005)

    def write(self, address: int, data: bytes) -> None:
        if self._memory is None:
            self._memory = os.open(f"/proc/{self.pid}/mem", os.O_RDWR)
        if os.pwrite(self._memory, data, address) != len(data):
            raise PtraceError(errno.EIO, f"short write to {address:#x}")

    def read(self, address: int, size: int) -> bytes:
        if self._memory is None:
            self._memory = os.open(f"/proc/{self.pid}/mem", os.O_RDWR)
        return os.pread(self._memory, size, address)

    def call(self, function: int, *arguments: int, timeout: float = 2.0) -> int:
        """``function(*arguments)`` on this thread; its return value (``rax``, unsigned). Raises
        ``TimeoutError`` (the call was abandoned, the registers put back) or ``PtraceError``."""
        assert self._saved is not None and len(arguments) <= len(_ARGUMENTS)
        registers = Registers.from_buffer_copy(self._saved)
        stack = ((self._saved.rsp - _STACK_SKIP) & ~0xF) - 8  # as after a `call`: rsp % 16 == 8
        self.write(stack, (0).to_bytes(8, "little"))  # the return address: returning faults at 0
        registers.rsp = stack
        registers.rip = function
        registers.rax = 0  # no vector registers used by a variadic callee
        registers.orig_rax = 2**64 - 1  # not in a system call: no restart into our function
        for name, value in zip(_ARGUMENTS, arguments, strict=False):
            setattr(registers, name, value & (2**64 - 1))
        _ptrace(_PTRACE_SETREGS, self.tid, 0, ctypes.addressof(registers))
        _ptrace(_PTRACE_CONT, self.tid, 0, 0)
        ends = time.monotonic() + timeout
        while True:
            try:
                stopped = self._wait_stop(max(0.0, ends - time.monotonic()))
            except TimeoutError:
                self._abandon()
                raise TimeoutError(f"the call did not return within {timeout:g} s") from None
            now = self._registers()
            if stopped == signal.SIGSEGV and now.rip == 0:
                return int(now.rax)
            if stopped in _FAULTS:
                # Our call faulted elsewhere: the registers go back at let-go and the fault is dropped.
                raise PtraceError(errno.EFAULT, f"the call stopped with signal {stopped} at {now.rip:#x}")
            # Any other signal (a timer, SIGCHLD): the program's, delivered to it as usual.
            deliver = 0 if stopped == signal.SIGTRAP else stopped
            _ptrace(_PTRACE_CONT, self.tid, 0, deliver)

    def _abandon(self) -> None:
        """Stop the thread wherever our call got to; ``_let_go`` puts the saved registers back."""
        _ptrace(_PTRACE_INTERRUPT, self.tid)
        self._wait_stop(5.0)
