//! The build-system files written beside a library: `NAME.pc` for pkg-config and
//! `NAME-config.cmake` for CMake's `find_package(NAME CONFIG)`. Both locate the library and the
//! header relative to their own folder, so the folder can be moved or installed anywhere.

/// Which library the files describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibKind {
    Static,
    Shared,
}

/// The system libraries the model's object needs at link time: threads and libm always;
/// libdl when a CUDA model loads the driver with `dlopen` (part of libc since glibc 2.34, but
/// older C libraries need it named).
pub fn system_libs(cuda: bool) -> Vec<&'static str> {
    let mut v = vec!["pthread", "m"];
    if cuda {
        v.push("dl");
    }
    v
}

/// `NAME.pc`. `stem` names the files (`libSTEM.a`, `STEM.h`), `model_name` goes into the
/// description.
pub fn pkg_config(stem: &str, model_name: &str, kind: LibKind, cuda: bool) -> String {
    let sys: Vec<String> = system_libs(cuda).iter().map(|l| format!("-l{l}")).collect();
    let sys = sys.join(" ");
    // A static library names its file (`-l:libSTEM.a`, understood by GNU ld, gold and lld) so
    // that a shared library of the same name in the folder is not picked instead, and carries
    // the system libraries in `Libs:` because nothing records them in the archive. A shared
    // library records them itself (DT_NEEDED), so they are only private there.
    let (libs, private) = match kind {
        LibKind::Static => (format!("-L${{libdir}} -l:lib{stem}.a {sys}"), String::new()),
        LibKind::Shared => (
            format!("-L${{libdir}} -l{stem}"),
            format!("Libs.private: {sys}\n"),
        ),
    };
    format!(
        "# pkg-config file for the model \"{model_name}\" compiled by kiln {version}.\n\
         # prefix is this file's folder, so the folder may be moved:\n\
         #   PKG_CONFIG_PATH=DIR pkg-config --cflags --libs {stem}\n\
         prefix=${{pcfiledir}}\n\
         libdir=${{prefix}}\n\
         includedir=${{prefix}}\n\
         \n\
         Name: {stem}\n\
         Description: the model \"{model_name}\" compiled by kiln ({kind})\n\
         Version: {version}\n\
         Cflags: -I${{includedir}}\n\
         Libs: {libs}\n\
         {private}",
        version = env!("CARGO_PKG_VERSION"),
        kind = match kind {
            LibKind::Static => "static library",
            LibKind::Shared => "shared library",
        },
    )
}

/// `NAME-config.cmake`: an imported target `kiln::STEM` carrying the header folder and the
/// libraries to link.
pub fn cmake_config(stem: &str, model_name: &str, kind: LibKind, cuda: bool) -> String {
    let mut link = vec!["Threads::Threads".to_string(), "m".to_string()];
    if cuda {
        link.push("${CMAKE_DL_LIBS}".to_string());
    }
    let (cmake_kind, file, soname) = match kind {
        LibKind::Static => ("STATIC", format!("lib{stem}.a"), String::new()),
        // The library's DT_SONAME: executables record it, not the build-time path, and find the
        // library through their RPATH (CMake sets it for the build tree) or the loader's path.
        LibKind::Shared => (
            "SHARED",
            format!("lib{stem}.so"),
            format!("\n    IMPORTED_SONAME \"lib{stem}.so\""),
        ),
    };
    format!(
        "# CMake package file for the model \"{model_name}\" compiled by kiln {version}.\n\
         #   find_package({stem} CONFIG REQUIRED)   # with CMAKE_PREFIX_PATH or {stem}_DIR = this folder\n\
         #   target_link_libraries(app PRIVATE kiln::{stem})\n\
         # Paths are relative to this file, so the folder may be moved.\n\
         include(CMakeFindDependencyMacro)\n\
         find_dependency(Threads)\n\
         if(NOT TARGET kiln::{stem})\n\
         \x20 add_library(kiln::{stem} {cmake_kind} IMPORTED)\n\
         \x20 set_target_properties(kiln::{stem} PROPERTIES\n\
         \x20   IMPORTED_LOCATION \"${{CMAKE_CURRENT_LIST_DIR}}/{file}\"{soname}\n\
         \x20   INTERFACE_INCLUDE_DIRECTORIES \"${{CMAKE_CURRENT_LIST_DIR}}\"\n\
         \x20   INTERFACE_LINK_LIBRARIES \"{link}\")\n\
         endif()\n\
         set({stem}_FOUND TRUE)\n",
        version = env!("CARGO_PKG_VERSION"),
        link = link.join(";"),
    )
}

/// A GNU ld version script exporting exactly `symbols` from a shared library.
pub fn version_script(symbols: &[String]) -> String {
    let mut s = String::from("{\n  global:\n");
    for sym in symbols {
        s.push_str(&format!("    {sym};\n"));
    }
    s.push_str("  local:\n    *;\n};\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_config_is_relocatable_and_names_the_archive() {
        let pc = pkg_config("tiny", "tiny", LibKind::Static, false);
        assert!(pc.contains("prefix=${pcfiledir}\n"), "{pc}");
        assert!(
            pc.contains("Libs: -L${libdir} -l:libtiny.a -lpthread -lm\n"),
            "{pc}"
        );
        let pc = pkg_config("tiny", "tiny", LibKind::Shared, true);
        assert!(pc.contains("Libs: -L${libdir} -ltiny\n"), "{pc}");
        assert!(pc.contains("Libs.private: -lpthread -lm -ldl\n"), "{pc}");
    }

    #[test]
    fn cmake_config_defines_an_imported_target() {
        let c = cmake_config("tiny", "tiny", LibKind::Shared, false);
        assert!(c.contains("add_library(kiln::tiny SHARED IMPORTED)"), "{c}");
        assert!(
            c.contains("IMPORTED_LOCATION \"${CMAKE_CURRENT_LIST_DIR}/libtiny.so\""),
            "{c}"
        );
        assert!(c.contains("IMPORTED_SONAME \"libtiny.so\""), "{c}");
        assert!(
            c.contains("INTERFACE_LINK_LIBRARIES \"Threads::Threads;m\""),
            "{c}"
        );
    }

    #[test]
    fn version_script_hides_everything_else() {
        let v = version_script(&["a_run".into(), "a_create".into()]);
        assert_eq!(
            v,
            "{\n  global:\n    a_run;\n    a_create;\n  local:\n    *;\n};\n"
        );
    }
}
