package worker

import (
	"runtime"
	"sync"

	"github.com/corral-dev/corral/internal/workerproto"
)

// spareThreads is how many threads ReserveThreads makes sure the process
// has beyond GOMAXPROCS: enough for every goroutine of a run that can block
// in a system call at once (waiting for the agent, writing its two logs,
// status.json). A worker that died for want of one had 7 threads in all;
// with the reserve it has about 11.
const spareThreads = 6

// CapProcs caps GOMAXPROCS at workerproto.WorkerProcs. Call it first
// thing in a sandbox's process. A garbage collection starts a mark worker
// for each P, each on a thread of its own, and the runtime never ends an
// idle thread: uncapped, a warm worker collecting its start-up garbage
// before it waits (RunWarm) had 20 threads as on a host of 64 CPUs, not
// 5, and every thread counts against the sandbox's pids limit.
func CapProcs() { capProcs(workerproto.WorkerProcs) }

// ReserveThreads makes the Go runtime start, now, the threads this
// process will need, and keep them idle (it never ends an idle thread),
// and caps GOMAXPROCS at workerproto.WorkerProcs. Call it before
// starting what shares the sandbox's pids limit with it: an agent that
// spends the limit (a fork bomb, or just many processes) would otherwise
// leave the runtime unable to start a thread the moment it needs one,
// and it would die ("failed to create new OS thread", exit code 2)
// without reporting the task's end. The reserve counts against the limit
// like any thread. It is made once per process: the threads stay, and a
// second call would only wake each of them to find it there (0.2 to 0.3 ms
// of a warm task's run on Linux, whose worker reserved them while it
// waited).
func ReserveThreads() { reserveOnce() }

var reserveOnce = sync.OnceFunc(func() { reserveThreads(workerproto.WorkerProcs, spareThreads) })

// ReserveReaperThreads is ReserveThreads for a sandbox's pid 1, which
// only waits for its children and forwards signals: one P, and a spare
// thread for the goroutine that forwards a signal while the main one
// waits. Uncapped, GOMAXPROCS is the host's CPUs (gVisor shows them all),
// and the first garbage collection (forced after two minutes) starts a
// mark worker for each: on a large host, more threads than an agent that
// spent the pids limit left, and pid 1's death ends the sandbox.
func ReserveReaperThreads() { reserveThreads(1, 2) }

// capProcs caps GOMAXPROCS at procs.
func capProcs(procs int) {
	if runtime.GOMAXPROCS(0) > procs {
		runtime.GOMAXPROCS(procs)
	}
}

// reserveThreads caps GOMAXPROCS at procs and has the runtime start procs
// plus spare threads.
func reserveThreads(procs, spare int) {
	capProcs(procs)
	n := runtime.GOMAXPROCS(0) + spare
	// Each goroutine holds a thread of its own while it waits (a locked
	// goroutine's thread waits with it), so the runtime starts one for
	// every other; unlocked before they return, the threads stay. The
	// reserve is not made until every goroutine has unlocked: until then
	// its thread is kept for it, not idle, and a busy host can leave it
	// waiting for the CPU well after release (a reaper that blocked in a
	// system call then needed a thread more than it had).
	var locked, release, unlocked sync.WaitGroup
	release.Add(1)
	for range n {
		locked.Add(1)
		unlocked.Add(1)
		go func() {
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
			unlocked.Done()
		}()
	}
	locked.Wait()
	release.Done()
	unlocked.Wait()
}
