# Installs the systemd units (packaging/*.service.in) at install time, configured with the prefix
# of this install: `cmake --install build --prefix P` writes units that run P/bin/infeedd with
# P/etc/infeed's configs, whatever CMAKE_INSTALL_PREFIX the build was configured with. Included by
# the install(CODE) of CMakeLists.txt, which sets:
#   IFD_SOURCE_DIR, IFD_BINARY_DIR
#   IFD_BINDIR, IFD_SYSCONFDIR, IFD_DATADIR   GNUInstallDirs' CMAKE_INSTALL_<dir> (relative or
#                                             absolute)
#   IFD_UNIT_DIR                              where the units go (relative: to the prefix)
#   IFD_UNIT_CUDA                             ON when the cuda backend is built
# CMAKE_INSTALL_PREFIX (the prefix of this install) and DESTDIR are the install script's own.

# As GNUInstallDirs makes CMAKE_INSTALL_FULL_<dir>, for the prefix of this install: sysconfdir
# is /etc for the prefixes / and /usr, /etc/opt/X for /opt/X.
function(ifd_unit_full_dir out dir kind)
  string(REGEX REPLACE "/+$" "" prefix "${CMAKE_INSTALL_PREFIX}")
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(kind STREQUAL "SYSCONFDIR" AND prefix MATCHES "^(/usr)?$")
    set(full "/${dir}")
  elseif(kind STREQUAL "SYSCONFDIR" AND prefix MATCHES "^/opt/")
    set(full "/${dir}${prefix}")
  else()
    set(full "${prefix}/${dir}")
  endif()
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

ifd_unit_full_dir(CMAKE_INSTALL_FULL_BINDIR "${IFD_BINDIR}" BINDIR)
ifd_unit_full_dir(CMAKE_INSTALL_FULL_SYSCONFDIR "${IFD_SYSCONFDIR}" SYSCONFDIR)
ifd_unit_full_dir(CMAKE_INSTALL_FULL_DATADIR "${IFD_DATADIR}" DATADIR)
ifd_unit_full_dir(unit_dir "${IFD_UNIT_DIR}" UNITDIR)

if(IFD_UNIT_CUDA)
  set(IFD_UNIT_DEVICES
      "# The cuda backend opens /dev/nvidia* and its driver may map code it generates: this build\n"
      "# has it, so PrivateDevices and MemoryDenyWriteExecute stay off (a unit that runs the cpu\n"
      "# backend only may turn both on in a drop-in: systemctl edit infeedd).\n"
      "PrivateDevices=no\n"
      "MemoryDenyWriteExecute=no")
else()
  set(IFD_UNIT_DEVICES
      "# The cpu backend (this build has no cuda) opens no device and maps no code it writes.\n"
      "PrivateDevices=yes\n"
      "MemoryDenyWriteExecute=yes")
endif()
string(CONCAT IFD_UNIT_DEVICES ${IFD_UNIT_DEVICES})
file(READ "${IFD_SOURCE_DIR}/packaging/infeedd-service.inc" IFD_UNIT_SERVICE)
string(CONFIGURE "${IFD_UNIT_SERVICE}" IFD_UNIT_SERVICE @ONLY)

set(units "")
foreach(unit infeedd.service infeedd@.service)
  configure_file("${IFD_SOURCE_DIR}/packaging/${unit}.in" "${IFD_BINARY_DIR}/systemd/${unit}"
                 @ONLY)
  list(APPEND units "${IFD_BINARY_DIR}/systemd/${unit}")
endforeach()
file(INSTALL DESTINATION "${unit_dir}" TYPE FILE FILES ${units})
