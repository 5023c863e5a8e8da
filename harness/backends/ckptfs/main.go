// Command ckptfs is a FUSE passthrough ("loopback") filesystem for chaos tests of
// checkpointing code: it mirrors --backing on --mount, can be made slow, and can
// "crash" the way Jepsen's LazyFS does, losing every write no fsync made durable.
//
//	ckptfs --backing DIR --mount DIR --control SOCKET_PATH
//
// It prints "ready" once mounted and serving; SIGTERM or SIGINT unmounts it and it
// exits 0. It mounts with mount(2) itself (no fusermount needed; root only). The
// control socket takes one command a line and answers one line, "ok ..." or "error ...":
//
//	latency MS      every write and fsync on the mount first sleeps MS ms (0 ends it);
//	                a write(2) over 1 MiB sleeps once per MiB (FUSE splits it)
//	crash [PREFIX]  lose the un-fsynced writes of files whose path (relative to the
//	                mount root) starts with PREFIX (all files if none):
//	                answers "ok lost N truncated M". PREFIX is a plain string prefix
//	                (a leading "/" is dropped): "ckpt/" for the folder ckpt only
//	status          answers "ok latency_ms=N dirty=K"
//
// The crash model, deliberately simple:
//   - A file created since the mount and never fsynced since its creation is deleted.
//   - A file written (write, truncate, fallocate, copy_file_range) since its last fsync
//     is truncated back to its size at that fsync. A file that existed before the mount
//     counts as fsynced at the mount. This is exact for append-only files (a journal);
//     for a file rewritten in place only the size comes back, not the old contents
//     (and a file truncated shorter is extended with zeros).
//   - Files only read, or untouched since the mount, are kept. Directory operations
//     (mkdir, rename, unlink, symlink, link) are kept as done. Hard links are not followed:
//     a file is known by the path it was written under (renames are followed).
//   - Flush/close does not make a file durable; fsync and fdatasync (on any handle of
//     the path) do. A write racing an fsync of the same file may count as durable.
//   - A crash does not close open handles: writes through a handle of a lost file go
//     to the unlinked file. What the kernel cached of the changed files is invalidated.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirtyFile is a file with changes no fsync has made durable yet.
type dirtyFile struct {
	created bool  // created since the mount, never fsynced: a crash deletes it
	size    int64 // otherwise its durable size: at its last fsync, or before its first change since the mount
}

// tracker holds the dirty files by path relative to the mount root, and the latency.
type tracker struct {
	backing   string
	latencyMs atomic.Int64
	mu        sync.Mutex
	dirty     map[string]*dirtyFile
}

var tr = &tracker{dirty: map[string]*dirtyFile{}}

// touch marks rel dirty; call it before changing the file, so that a file dirtied for
// the first time records its size before the change.
func (t *tracker) touch(rel string, created bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.dirty[rel]; ok {
		return
	}
	d := &dirtyFile{created: created}
	if !created {
		var st syscall.Stat_t
		if syscall.Lstat(filepath.Join(t.backing, rel), &st) != nil {
			return // not at its path: unlinked while open, nothing to lose
		}
		d.size = st.Size
	}
	t.dirty[rel] = d
}

// take removes and returns the entries for rel and everything under it, keyed by the
// rest of their path ("" for rel itself, "/x" for rel/x).
func (t *tracker) take(rel string) map[string]*dirtyFile {
	out := map[string]*dirtyFile{}
	for k, d := range t.dirty {
		if k == rel || strings.HasPrefix(k, rel+"/") {
			out[k[len(rel):]] = d
			delete(t.dirty, k)
		}
	}
	return out
}

// synced: an fsync made rel durable; its next change records its size anew.
func (t *tracker) synced(rel string) { t.mu.Lock(); delete(t.dirty, rel); t.mu.Unlock() }

// removed: rel was unlinked, nothing of it is left to lose.
func (t *tracker) removed(rel string) { t.mu.Lock(); t.take(rel); t.mu.Unlock() }

// renamed moves the state of from (a file, or a folder and all under it) to to. What
// was at to is gone (a replaced file) unless the two were exchanged.
func (t *tracker) renamed(from, to string, exchange bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, b := t.take(from), t.take(to)
	for rest, d := range a {
		t.dirty[to+rest] = d
	}
	if exchange {
		for rest, d := range b {
			t.dirty[from+rest] = d
		}
	}
}

// crash loses the un-fsynced writes under prefix (see the package comment) and forgets
// those files; it returns the counts and the paths it changed.
func (t *tracker) crash(prefix string) (lost, truncated int, paths []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for rel, d := range t.dirty {
		if !strings.HasPrefix(rel, prefix) {
			continue
		}
		p := filepath.Join(t.backing, rel)
		var err error
		if d.created {
			if err = os.Remove(p); err == nil || os.IsNotExist(err) {
				lost, err = lost+1, nil
			}
		} else if err = os.Truncate(p, d.size); err == nil {
			truncated++
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ckptfs: crash %s: %v\n", rel, err)
		}
		delete(t.dirty, rel)
		paths = append(paths, rel)
	}
	return lost, truncated, paths
}

// delay sleeps the configured latency, or until the request is interrupted.
func delay(ctx context.Context) syscall.Errno {
	if ms := tr.latencyMs.Load(); ms > 0 {
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
			return syscall.EINTR
		}
	}
	return 0
}

// node is a LoopbackNode whose changes to files are tracked. The loopback does the
// work; the overrides below only record dirty state and sleep.
type node struct{ fs.LoopbackNode }

func newNode(root *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
	return &node{fs.LoopbackNode{RootData: root}}
}

// rel is the node's path relative to the mount root ("" for the root).
func (n *node) rel() string { return n.Path(n.Root()) }

func (n *node) child(name string) string { return filepath.Join(n.rel(), name) }

// handle hides the loopback file's PassthroughFd: with it, go-fuse (as root, on a
// kernel with FUSE passthrough) hands the backing fd to the kernel, and reads and
// writes would no longer reach this process. Embedding this interface forwards
// everything else to the *fs.LoopbackFile (POSIX locks stay in the kernel: go-fuse
// only asks for them with MountOptions.EnableLocks).
type handle struct{ loopbackFile }

type loopbackFile interface {
	fs.FileReader
	fs.FileWriter
	fs.FileWritever
	fs.FileReleaser
	fs.FileFlusher
	fs.FileFsyncer
	fs.FileGetattrer
	fs.FileSetattrer
	fs.FileAllocater
	fs.FileLseeker
	fs.FileIoctler
	fs.FileStatxer
}

func wrap(f fs.FileHandle) fs.FileHandle {
	if lf, ok := f.(*fs.LoopbackFile); ok {
		return &handle{lf}
	}
	return f
}

func unwrap(f fs.FileHandle) fs.FileHandle {
	if h, ok := f.(*handle); ok {
		return h.loopbackFile
	}
	return f
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	rel := n.child(name)
	var st syscall.Stat_t
	existed := syscall.Lstat(filepath.Join(tr.backing, rel), &st) == nil
	if existed && flags&syscall.O_TRUNC != 0 {
		tr.touch(rel, false)
	}
	ch, f, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno == 0 && !existed {
		tr.touch(rel, true) // no write can come before the kernel has the handle
	}
	return ch, wrap(f), fl, errno
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 { // the kernel sends a setattr instead, unless ATOMIC_O_TRUNC
		tr.touch(n.rel(), false)
	}
	f, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return wrap(f), fl, errno
}

func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, f, fl, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out) // nameless: not tracked
	return ch, wrap(f), fl, errno
}

// Writev answers every WRITE (go-fuse prefers it for contiguous data too when Write is
// not defined). A write(2) over 1 MiB (MaxWrite) reaches us as several WRITEs, each
// one delayed.
func (n *node) Writev(ctx context.Context, f fs.FileHandle, data [][]byte, off int64) (uint32, syscall.Errno) {
	if errno := delay(ctx); errno != 0 {
		return 0, errno
	}
	w, ok := f.(fs.FileWritever)
	if !ok {
		return 0, syscall.EBADF
	}
	tr.touch(n.rel(), false)
	return w.Writev(ctx, data, off)
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if errno := delay(ctx); errno != 0 {
		return errno
	}
	s, ok := f.(fs.FileFsyncer)
	if !ok {
		return syscall.EBADF
	}
	errno := s.Fsync(ctx, flags) // fsync(2) of the backing file, for fdatasync too
	if errno == 0 {
		tr.synced(n.rel())
	}
	return errno
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		tr.touch(n.rel(), false)
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	a, ok := f.(fs.FileAllocater)
	if !ok {
		return syscall.ENOTSUP
	}
	tr.touch(n.rel(), false)
	return a.Allocate(ctx, off, size, mode)
}

func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode,
	fhOut fs.FileHandle, offOut, size, flags uint64) (uint32, syscall.Errno) {
	tr.touch(out.Path(n.Root()), false)
	// the loopback insists on its own file type on both sides
	return n.LoopbackNode.CopyFileRange(ctx, unwrap(fhIn), offIn, out, unwrap(fhOut), offOut, size, flags)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	errno := n.LoopbackNode.Unlink(ctx, name)
	if errno == 0 {
		tr.removed(n.child(name))
	}
	return errno
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	if errno == 0 {
		to := filepath.Join(newParent.EmbeddedInode().Path(n.Root()), newName)
		tr.renamed(n.child(name), to, flags&fs.RENAME_EXCHANGE != 0)
	}
	return errno
}

// invalidate makes the kernel forget what it cached of rel (its dentry, attributes and
// pages), so that readers through the mount see the crash at once.
func invalidate(root *fs.Inode, rel string) {
	parts := strings.Split(rel, "/")
	dir := root
	for _, name := range parts[:len(parts)-1] {
		if dir = dir.GetChild(name); dir == nil {
			return // never looked up: nothing cached
		}
	}
	name := parts[len(parts)-1]
	if ch := dir.GetChild(name); ch != nil {
		ch.NotifyContent(0, 0)
	}
	dir.NotifyEntry(name)
}

// command answers one control line.
func command(root *fs.Inode, line string) string {
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "latency":
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || ms < 0 {
			return "error latency wants a whole number of milliseconds >= 0"
		}
		tr.latencyMs.Store(ms)
		return "ok"
	case len(f) >= 1 && len(f) <= 2 && f[0] == "crash":
		prefix := ""
		if len(f) == 2 {
			prefix = strings.TrimPrefix(f[1], "/")
		}
		lost, truncated, paths := tr.crash(prefix)
		for _, p := range paths {
			invalidate(root, p)
		}
		return fmt.Sprintf("ok lost %d truncated %d", lost, truncated)
	case len(f) == 1 && f[0] == "status":
		tr.mu.Lock()
		k := len(tr.dirty)
		tr.mu.Unlock()
		return fmt.Sprintf("ok latency_ms=%d dirty=%d", tr.latencyMs.Load(), k)
	}
	return fmt.Sprintf("error unknown command %q (latency MS | crash [PREFIX] | status)", line)
}

func serveControl(ln net.Listener, root *fs.Inode) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return // closed at exit
		}
		go func() {
			defer conn.Close()
			sc := bufio.NewScanner(conn)
			for sc.Scan() {
				if _, err := fmt.Fprintln(conn, command(root, sc.Text())); err != nil {
					return
				}
			}
		}()
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ckptfs: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	backing := flag.String("backing", "", "folder to mirror")
	mnt := flag.String("mount", "", "mount point")
	control := flag.String("control", "", "Unix socket path for control commands")
	flag.Parse()
	if *backing == "" || *mnt == "" || *control == "" || flag.NArg() > 0 {
		fail("usage: ckptfs --backing DIR --mount DIR --control SOCKET_PATH")
	}
	var err error
	if tr.backing, err = filepath.Abs(*backing); err != nil {
		fail("backing %s: %v", *backing, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(tr.backing, &st); err != nil {
		fail("backing %s: %v", tr.backing, err)
	}
	// As fs.NewLoopbackRoot, with our node type for every node.
	root := &fs.LoopbackRoot{Path: tr.backing, Dev: uint64(st.Dev), NewNode: newNode}
	rootNode := newNode(root, nil, "", &st)
	root.RootNode = rootNode

	sec := time.Second
	server, err := fs.Mount(*mnt, rootNode, &fs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		MountOptions: fuse.MountOptions{
			AllowOther:        true, // Docker bind-mounts it into containers
			DirectMountStrict: true, // mount(2) ourselves; there is no fusermount to fall back to
			FsName:            tr.backing,
			Name:              "ckptfs", // the type in /proc/mounts: fuse.ckptfs
			MaxWrite:          1 << 20,  // fewer WRITEs (each one delayed) per big write(2); capped by the kernel
		},
	})
	if err != nil {
		fail("mount %s on %s: %v", tr.backing, *mnt, err)
	}

	os.Remove(*control) // a stale socket from an earlier run
	ln, err := net.Listen("unix", *control)
	if err != nil {
		server.Unmount()
		fail("control socket %s: %v", *control, err)
	}
	go serveControl(ln, rootNode.EmbeddedInode())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("ready")
	<-sig

	ln.Close() // also removes the socket file
	// With DirectMountStrict, server.Unmount is umount(2) (retried a few times) and then
	// waits for the request loops to end. If the mount is busy (a process has a file or
	// its cwd there), detach it lazily. The loops only end once no mount of this
	// filesystem is left: a bind mount of it (a container's) keeps them going, so wait
	// a while only. When we exit, the kernel aborts the connection and whatever still
	// uses the filesystem gets ENOTCONN.
	done := make(chan error, 1)
	go func() { done <- server.Unmount() }()
	select {
	case err := <-done:
		if err != nil {
			if err2 := syscall.Unmount(*mnt, syscall.MNT_DETACH); err2 != nil {
				fmt.Fprintf(os.Stderr, "ckptfs: unmount %s: %v; lazy unmount: %v\n", *mnt, err, err2)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "ckptfs: unmount %s: %v; detached it lazily\n", *mnt, err)
		}
	case <-time.After(5 * time.Second):
		fmt.Fprintf(os.Stderr, "ckptfs: unmounted %s, but other mounts of it (bind mounts?) remain; exiting anyway\n", *mnt)
	}
}
