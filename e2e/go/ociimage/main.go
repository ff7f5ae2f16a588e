// Command ociimage writes a one-layer linux/amd64 image as a docker archive (the format
// `ctr images import` and `docker load` read) without a container engine or a registry.
// The archive names the image REF, so importing it registers exactly that reference.
//
//	ociimage -ref REF -o OUT.tar [-root DIR] [-entrypoint JSON] [-cmd JSON] [-env K=V]...
//	         [-workdir DIR] [-user UID:GID] [DEST=SRC | DEST->TARGET]...
//
// -root DIR puts the whole tree under DIR at / (owners and modes kept; device nodes, sockets
// and fifos skipped: the runtime makes /dev). Each DEST=SRC adds the host file SRC at DEST
// with SRC's mode; each DEST->TARGET adds a symbolic link. Entries are owned by root and
// dated 1970 so the same inputs give the same layer digest.
package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

var epoch = time.Unix(0, 0)

func main() {
	ref := flag.String("ref", "", "image reference the archive names (required)")
	out := flag.String("o", "", "archive to write (required)")
	root := flag.String("root", "", "directory to put at /")
	entrypoint := flag.String("entrypoint", "", `ENTRYPOINT as a JSON array, e.g. ["/csi-provisioner"]`)
	cmd := flag.String("cmd", "", "CMD as a JSON array")
	workdir := flag.String("workdir", "", "working directory")
	user := flag.String("user", "", "USER, e.g. 65535:65535")
	var env multi
	flag.Var(&env, "env", "K=V for the image's environment (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" {
		fail("usage: ociimage -ref REF -o OUT.tar [-root DIR] [flags] [DEST=SRC | DEST->TARGET]...")
	}
	tag, err := name.ParseReference(*ref)
	check(err)

	// The layer is written once to a temporary tar; the library compresses it from there.
	tmp, err := os.CreateTemp(filepath.Dir(*out), ".layer-*.tar")
	check(err)
	defer os.Remove(tmp.Name())
	w := &layerWriter{tw: tar.NewWriter(tmp), dirs: map[string]bool{"": true}, links: map[[2]uint64]string{}}
	if *root != "" {
		w.addTree(*root)
	}
	for _, spec := range flag.Args() {
		if dest, target, ok := strings.Cut(spec, "->"); ok {
			w.add(&tar.Header{Typeflag: tar.TypeSymlink, Name: clean(dest), Linkname: target, Mode: 0o777})
		} else if dest, src, ok := strings.Cut(spec, "="); ok {
			w.addFile(clean(dest), src)
		} else {
			fail("bad entry %q: want DEST=SRC or DEST->TARGET", spec)
		}
	}
	check(w.tw.Close())
	check(tmp.Close())

	layer, err := tarball.LayerFromFile(tmp.Name(), tarball.WithCompressionLevel(gzip.BestSpeed))
	check(err)
	img, err := mutate.AppendLayers(empty.Image, layer)
	check(err)
	cf, err := img.ConfigFile()
	check(err)
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created.Time = "linux", "amd64", epoch
	cf.Config.Entrypoint = jsonList(*entrypoint)
	cf.Config.Cmd = jsonList(*cmd)
	cf.Config.Env = env
	cf.Config.WorkingDir = *workdir
	cf.Config.User = *user
	img, err = mutate.ConfigFile(img, cf)
	check(err)
	check(tarball.WriteToFile(*out, tag, img))
}

type layerWriter struct {
	tw    *tar.Writer
	dirs  map[string]bool      // directories already in the layer
	links map[[2]uint64]string // (device, inode) → first name, for hard links
}

// add writes one entry, first adding any parent directory not yet in the layer.
func (w *layerWriter) add(h *tar.Header) {
	if p := path.Dir(strings.TrimSuffix(h.Name, "/")); p != "." && !w.dirs[p] {
		w.add(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: 0o755})
	}
	if h.Typeflag == tar.TypeDir {
		w.dirs[strings.TrimSuffix(h.Name, "/")] = true
	}
	h.ModTime, h.AccessTime, h.ChangeTime, h.Format = epoch, time.Time{}, time.Time{}, tar.FormatPAX
	check(w.tw.WriteHeader(h))
}

func (w *layerWriter) addFile(dest, src string) {
	fi, err := os.Stat(src)
	check(err)
	if !fi.Mode().IsRegular() {
		fail("%s is not a regular file", src)
	}
	w.add(&tar.Header{Typeflag: tar.TypeReg, Name: dest, Mode: int64(fi.Mode().Perm()), Size: fi.Size()})
	w.copy(src)
}

func (w *layerWriter) copy(src string) {
	f, err := os.Open(src)
	check(err)
	defer f.Close()
	_, err = io.Copy(w.tw, f)
	check(err)
}

func (w *layerWriter) addTree(root string) {
	check(filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		check(err)
		rel, err := filepath.Rel(root, p)
		check(err)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		check(err)
		st := fi.Sys().(*syscall.Stat_t)
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: tarMode(fi.Mode()), Uid: int(st.Uid), Gid: int(st.Gid)}
		switch m := fi.Mode(); {
		case m.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			w.add(h)
		case m&fs.ModeSymlink != 0:
			h.Typeflag = tar.TypeSymlink
			h.Linkname, err = os.Readlink(p)
			check(err)
			w.add(h)
		case m.IsRegular():
			id := [2]uint64{uint64(st.Dev), st.Ino}
			if first, seen := w.links[id]; seen && st.Nlink > 1 {
				h.Typeflag, h.Linkname = tar.TypeLink, first
				w.add(h)
				return nil
			}
			w.links[id] = h.Name
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			w.add(h)
			w.copy(p)
		} // device nodes, fifos, sockets: the runtime provides /dev
		return nil
	}))
}

// tarMode: tar's setuid/setgid/sticky bits are not Go's fs.FileMode ones.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func clean(dest string) string { return strings.TrimPrefix(path.Clean("/"+dest), "/") }

func jsonList(s string) []string {
	if s == "" {
		return nil
	}
	var l []string
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		fail("%q is not a JSON array of strings: %v", s, err)
	}
	return l
}

func check(err error) {
	if err != nil {
		fail("%v", err)
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "ociimage: "+format+"\n", a...)
	os.Exit(1)
}
