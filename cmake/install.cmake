# Installation and the CMake package: after `cmake --install build --prefix P`,
#
#   find_package(feedline 0.1 REQUIRED)                     # feedline::feedline and its layers
#   find_package(feedline 0.1 REQUIRED COMPONENTS torch)    # and feedline::torch (LibTorch)
#
# The layers are libraries of their own (src/CMakeLists.txt): feedline::engine (the pipeline,
# the copy stage, the generic factory: Abseil, oneTBB, the CUDA runtime), feedline::io,
# feedline::image, feedline::text; feedline::feedline is all of them with the image factory.
#
# with CMAKE_PREFIX_PATH=P. Everything installed here is in the install component "feedline"
# (`cmake --install build --component feedline` installs only the library and its package).
#
# feedline's libraries are static, so their private dependencies (oneTBB, libjpeg-turbo, libspng,
# OpenCV core/imgproc, Abseil, ...) appear in the exported link interface as $<LINK_ONLY:...>; the
# package config finds them for the consumer, with the find modules of cmake/ installed next to
# it for the ones that ship no CMake package. The adapter has its own export set
# (feedlineTorchTargets), loaded only when the "torch" component is asked for, so that consumers
# who do not use LibTorch never need it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FEEDLINE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/feedline")

install(TARGETS feedline feedline_engine feedline_io feedline_image feedline_text feedline_video
  EXPORT feedlineTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT feedline
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT feedline
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT feedline)
# The SentencePiece plugin (src/text/sentencepiece_plugin_api.h), loaded at run time from
# lib/feedline: the package adds that folder to its consumers' RUNPATH.
install(TARGETS feedline_sentencepiece
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/feedline COMPONENT feedline)
# The static CUDA runtime the library was built with, for consumers without the toolkit
# (feedlineConfig.cmake uses it when it finds no CUDAToolkit).
if(FEEDLINE_CUDA_FOUND)
  get_target_property(_feedline_cudart CUDA::cudart_static IMPORTED_LOCATION)
  install(FILES "${_feedline_cudart}" DESTINATION ${CMAKE_INSTALL_LIBDIR}/feedline
    RENAME libcudart_static.a COMPONENT feedline)
endif()
install(EXPORT feedlineTargets
  NAMESPACE feedline::
  DESTINATION ${FEEDLINE_INSTALL_CMAKEDIR}
  COMPONENT feedline)

# The public headers; torch.h and torch_data.h only with the adapter that implements them.
set(_feedline_header_excludes)
if(NOT TARGET feedline_torch)
  set(_feedline_header_excludes PATTERN torch.h EXCLUDE PATTERN torch_data.h EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/feedline
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  COMPONENT feedline
  FILES_MATCHING PATTERN "*.h" ${_feedline_header_excludes})

if(TARGET feedline_torch)
  install(TARGETS feedline_torch EXPORT feedlineTorchTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT feedline
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT feedline
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT feedline)
  install(EXPORT feedlineTorchTargets
    NAMESPACE feedline::
    DESTINATION ${FEEDLINE_INSTALL_CMAKEDIR}
    COMPONENT feedline)
endif()

configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/feedlineConfig.cmake.in
  ${PROJECT_BINARY_DIR}/feedlineConfig.cmake
  INSTALL_DESTINATION ${FEEDLINE_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/feedlineConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
    ${PROJECT_BINARY_DIR}/feedlineConfig.cmake
    ${PROJECT_BINARY_DIR}/feedlineConfigVersion.cmake
    # For the dependencies that ship no CMake package (see feedlineConfig.cmake.in).
    ${PROJECT_SOURCE_DIR}/cmake/FindSPNG.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindxxHash.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindWebP.cmake
    ${PROJECT_SOURCE_DIR}/cmake/FindOpenCVImgproc.cmake
  DESTINATION ${FEEDLINE_INSTALL_CMAKEDIR}
  COMPONENT feedline)
